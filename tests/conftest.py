"""Shared fixtures: real tokenizers and models, loaded once per test session."""

import os
from pathlib import Path

import pytest
import torch

# The real GSM8K files sit in ../shared beside the clone; the package reads the same variable.
_SHARED_GSM8K = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k"
if _SHARED_GSM8K.is_dir():
    os.environ.setdefault("LLM_GYM_GSM8K_PATH", str(_SHARED_GSM8K))
GSM8K_PATH = Path(os.environ.get("LLM_GYM_GSM8K_PATH", _SHARED_GSM8K))

# The device-dependent tests take these: the CPU everywhere, CUDA where there is a GPU.
DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA GPU")),
]  # fmt: skip


@pytest.fixture(scope="session")
def gpt2_tokenizer():
    from llm_gym.lm.loading import load_gpt2_tokenizer

    return load_gpt2_tokenizer()


@pytest.fixture(scope="session")
def default_model():
    """SmolLM2-135M-Instruct and its tokenizer (converted from the GGUF once, then cached)."""
    from llm_gym.lm.loading import load_default_model

    return load_default_model()


@pytest.fixture
def one_thread():
    """Torch on one thread for the test (its reductions in one order), as it was after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def smollm2_tokenizer(default_model):
    return default_model[1]


# Fresh per test module (module scope): tests that take gradients leave them on the model.
@pytest.fixture(scope="module")
def smol(default_model):
    return default_model


@pytest.fixture(scope="module")
def tiny(smollm2_tokenizer):
    """A random 2-layer llama over SmolLM2's vocabulary."""
    from llm_gym.lm.loading import tiny_model

    return tiny_model(smollm2_tokenizer), smollm2_tokenizer


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, smollm2_tokenizer):
    """A folder with a seeded tiny llama and SmolLM2's tokenizer (what --model PATH loads)."""
    from llm_gym.lm.loading import tiny_model

    folder = tmp_path_factory.mktemp("tiny")
    tiny_model(smollm2_tokenizer, seed=0).save_pretrained(folder)
    smollm2_tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def tiny_gpt2(gpt2_tokenizer):
    """A random 2-layer GPT-2 (absolute positions) with GPT-2's tokenizer: pad == eos."""
    from llm_gym.lm.loading import tiny_model

    return tiny_model(gpt2_tokenizer, arch="gpt2", seed=1), gpt2_tokenizer


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory, smollm2_tokenizer):
    """Two different tiny models saved as folders, as a user's --model/--ref-model."""
    from llm_gym.lm.loading import tiny_model

    dirs = []
    for seed in (0, 1):
        folder = tmp_path_factory.mktemp(f"tiny{seed}")
        tiny_model(smollm2_tokenizer, seed=seed).save_pretrained(folder)
        smollm2_tokenizer.save_pretrained(folder)
        dirs.append(str(folder))
    return dirs


# Two GSM8K questions whose answers are one digit, for the model that answers one digit.
DIGIT_ROWS = [
    {"question": "What is 2 + 3?", "answer": "#### 5"},
    {"question": "What is 1 + 3?", "answer": "#### 4"},
]


@pytest.fixture(scope="session")
def digits(tmp_path_factory, smollm2_tokenizer):
    """A tiny llama whose next token is "4", "5" or "6", whatever the prompt (its last layer
    adds a large constant that the output layer reads; heads of 32, as vLLM's CPU attention
    takes): GSM8K's reward then varies within a group, so the advantages are not zero and
    the update moves the weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = smollm2_tokenizer
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, mlp_bias=True, tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.model.layers[-1].mlp.down_proj.bias[0] = 100.0
        model.model.norm.weight.zero_()
        model.model.norm.weight[0] = 1.0
        model.lm_head.weight.zero_()
        for digit in "456":
            model.lm_head.weight[tok.convert_tokens_to_ids(digit), 0] = 2.0
    folder = tmp_path_factory.mktemp("digits")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


# The running vllm_default server, and the last test to use it: once that test is done the
# server is closed, not left idling beside the rest of the run.
_VLLM = {"sampler": None, "last": None}


@pytest.fixture(scope="session")
def vllm_default(tmp_path_factory, smollm2_tokenizer):
    """One vLLM server of the default model (fp32, 2048 tokens of context) for the whole test
    run, started by the first test that asks for it and stopped after the last: a
    ``VLLMSampler`` whose ``with_settings`` gives each test its own sampling settings over the
    same server. Tests that change its weights or kill it start their own. At the end none of
    its processes is left."""
    from backend_fixture import server_processes, wait_gone

    from llm_gym.samplers import VLLMSampler

    before = set(server_processes())
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    sampler = VLLMSampler(
        "default", dtype="float32", engine_args={"max_model_len": 2048}, log_path=log,
        vocab_size=len(smollm2_tokenizer),
    )  # fmt: skip
    _VLLM["sampler"] = sampler
    try:
        yield sampler
    finally:
        sampler.close()
    assert wait_gone(set(server_processes()) - before) == {}  # no server process left


# Under pytest-xdist (pyproject's -n 2 --dist loadgroup), what runs on one worker in turn: the
# tests that start vLLM servers (they count the machine's server processes, and one server of
# the default model serves them all) and those that start a local Ray cluster (a Ray run beside
# a vLLM test lost an env worker once, in a measured run of the suite): one group.
_ONE_WORKER = ("vllm", "ray")
SERVERS = "servers"  # the group's name


def pytest_itemcollected(item):
    # As each test is collected: before xdist's own collection hook reads the groups.
    if any(item.get_closest_marker(mark) is not None for mark in _ONE_WORKER):
        item.add_marker(pytest.mark.xdist_group(SERVERS))


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected
def pytest_collection_modifyitems(items):
    users = [item.nodeid for item in items if "vllm_default" in getattr(item, "fixturenames", ())]
    _VLLM["last"] = users[-1] if users else None


def pytest_runtest_teardown(item, nextitem):
    if item.nodeid == _VLLM["last"] and _VLLM["sampler"] is not None:
        _VLLM["sampler"].close()  # idempotent: the fixture's own teardown closes it again
