"""LoRA through peft (issue 42, item 2): only the adapters train, the KL's reference is the
model with its adapter disabled, checkpoints hold the adapter and resume exactly, and
``--model CHECKPOINT`` (and a server) get the adapter merged."""

import json

import numpy as np
import pytest
import torch

from llm_gym.cli import main
from llm_gym.lm.loading import load_model
from llm_gym.lm.lora import (
    AdapterDisabled,
    is_lora,
    load_lora,
    merged_weights,
    save_adapter,
    with_lora,
)
from llm_gym.policies import TransformersPolicy
from llm_gym.samplers.weights import served_tensors
from llm_gym.train import GRPOConfig, GRPOTrainer, resumed_config
from llm_gym.train.checkpoints import checkpoint_folders, latest_checkpoint, load_checkpoint

TIMING = ("seconds", "tokens_per_second")


# One thread: reductions in one order, so that runs compare bit for bit.
pytestmark = pytest.mark.usefixtures("one_thread")


def config(model, out, **changes):
    # float32 pinned: in bfloat16 the first KL is exactly 0, so the adapter's B never moves.
    # A constant rate: the resume test's shorter first run would decay it sooner.
    values = dict(
        model=model, out=str(out), env_args={"task": "chain_sum", "level": 2},
        kl_coef=0.5, learning_rate=5e-2, groups=2, group_size=2, max_new_tokens=4,
        eval_episodes=0, iterations=4, save_every=2, progress=False, lora_rank=4,
        lora_target_modules="all-linear", dtype="float32", lr_schedule="constant",
    )  # fmt: skip
    return GRPOConfig(**{**values, **changes})


def metrics(out):
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k not in TIMING} for row in rows]


def test_only_the_adapters_train_and_the_checkpoint_holds_them_alone(tiny_dir, tmp_path):
    trainer = GRPOTrainer(config(tiny_dir, tmp_path, iterations=2, save_every=1))
    assert is_lora(trainer.model)
    base = {k: v.clone() for k, v in load_model(tiny_dir)[0].state_dict().items()}
    trained = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert trained and all(".lora_" in name for name in trained)
    trainer.train()
    # The base weights did not move; the adapters did (B starts at zero).
    frozen = trainer.model.get_base_model().state_dict()
    for name, value in base.items():
        key = name if name in frozen else name.replace(".weight", ".base_layer.weight")
        assert torch.equal(frozen[key], value), name
    assert any(p.abs().max() > 0 for n, p in trainer.model.named_parameters() if "lora_B" in n)
    folder = latest_checkpoint(tmp_path)
    files = {path.name for path in folder.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors"} <= files
    assert "model.safetensors" not in files and "config.json" not in files
    adapter = json.loads((folder / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == tiny_dir and adapter["r"] == 4
    state, tensors = load_checkpoint(checkpoint_folders(tmp_path)[0])
    assert state["iteration"] == 1 and (checkpoint_folders(tmp_path)[0] / "optimizer").is_dir()


def test_a_lora_checkpoint_loads_merged_as_a_model_and_matches_the_trained_one(tiny_dir, tmp_path):
    trainer = GRPOTrainer(config(tiny_dir, tmp_path, iterations=1, save_every=1))
    trainer.train()
    merged, tokenizer = load_model(latest_checkpoint(tmp_path))  # what --model PATH does
    assert not is_lora(merged)
    ids = torch.tensor([tokenizer("What is 2 + 3?")["input_ids"]])
    with torch.no_grad():
        want = trainer.model(input_ids=ids).logits
        got = merged(input_ids=ids).logits
    assert torch.allclose(got, want, atol=1e-5)
    # What a server is sent: the same merged weights, the model left as it is.
    sent = served_tensors(trainer.model)
    for name, value in merged.state_dict().items():
        assert torch.allclose(sent[name], value, atol=1e-6), name
    assert is_lora(trainer.model) and len(merged_weights(trainer.model)) == len(sent)


def test_the_kl_reference_is_the_base_model_with_the_adapter_disabled(tiny_dir):
    base, tokenizer = load_model(tiny_dir)
    reference = TransformersPolicy(base, tokenizer, input_mode="tokens", generate=False)
    model = with_lora(load_model(tiny_dir)[0], 4, target_modules="all-linear")
    with torch.no_grad():  # moved away from the base, as training does
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    scorer = TransformersPolicy(model, tokenizer, input_mode="tokens", generate=False)
    prompts = [np.array([1, 5, 9, 11]), np.array([3, 7])]
    responses = [np.array([20, 21, 22]), np.array([30])]
    expected = reference.score(prompts, responses)
    got = AdapterDisabled(scorer).score(prompts, responses)
    adapted = scorer.score(prompts, responses)
    for e, g, a in zip(expected, got, adapted, strict=True):
        assert np.allclose(g, e, atol=1e-6) and not np.allclose(a, e, atol=1e-3)
    with pytest.raises(TypeError, match="scorer must score a peft"):
        AdapterDisabled(reference)


# LoRA's dropout: off in training (sampling through a resumed adapter too), or in the loss's
# forwards, its masks drawn from the random state the checkpoint restores.
@pytest.mark.parametrize(
    "dropout", [{}, {"lora_dropout": 0.5}, {"lora_dropout": 0.5, "keep_dropout": True}]
)
def test_a_resumed_lora_run_equals_an_uninterrupted_one(tiny_dir, tmp_path, dropout):
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    GRPOTrainer(config(tiny_dir, whole, **dropout)).train()
    GRPOTrainer(config(tiny_dir, parts, iterations=2, save_optimizer=True, **dropout)).train()
    GRPOTrainer(resumed_config(parts, iterations=4)).train()
    expected = metrics(whole)
    assert len({row["kl"] for row in expected}) == 4  # the KL moves: the curves say something
    for a, b in zip(metrics(parts), expected, strict=True):
        assert a.keys() == b.keys()
        for key, value in b.items():
            assert a[key] == pytest.approx(value, abs=1e-6), (b["iteration"], key)


def test_an_adapter_loaded_to_train_on_runs_without_dropout(tiny_dir, tmp_path):
    # What a resumed run samples and scores with: the same logits from the same input.
    model = with_lora(load_model(tiny_dir)[0], 4, dropout=0.5, target_modules="all-linear")
    with torch.no_grad():  # B away from 0, as training moves it: the dropout now shows
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    save_adapter(model, tmp_path / "adapter", tiny_dir)
    ids = torch.tensor([[1, 5, 9, 11, 20, 21, 22]])
    for loaded in (model, load_lora(load_model(tiny_dir)[0], tmp_path / "adapter", trainable=True)):
        assert not any(m.training for m in loaded.modules())
        assert any(p.requires_grad for p in loaded.parameters())  # the adapter trains on
        with torch.no_grad():
            logits = [loaded(input_ids=ids).logits for _ in range(3)]
            assert torch.equal(logits[0], logits[1]) and torch.equal(logits[0], logits[2])
            loaded.train()  # what peft left: LoRA's dropout on, each forward its own masks
            assert not torch.allclose(loaded(input_ids=ids).logits, logits[0], atol=1e-3)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--lora-alpha", "8"], "pass lora_rank"),
        (["--lora-rank", "-1"], "--lora-rank: expected a number >= 0"),
        (["--lora-rank", "4", "--lora-target-modules", "q proj"], "module names"),
        (["--lora-rank", "4", "--lora-dropout", "1.5"], "lora_dropout must be below 1"),
    ],
)
def test_lora_flag_errors_are_one_line(argv, message, tmp_path, capsys):
    try:  # a value the parser refuses exits there; one the config refuses returns
        code = main(["train", *argv, "--out", str(tmp_path / "run")])
    except SystemExit as exit:
        code = exit.code
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
