"""``llm-gym train --backend vllm``: the vLLM server samples with the weights of the last update
(every episode carries the version that sampled it), its log-probs follow the trained model and
leave the initial one, the run resumes, and no server outlives the run. A real vLLM server."""

import json

import numpy as np
import pytest
import torch
from backend_fixture import FP32_TOLERANCE, prompts_for, server_processes, wait_gone
from conftest import DIGIT_ROWS

from llm_gym.cli import main
from llm_gym.lm.loading import load_model
from llm_gym.policies import TransformersPolicy
from llm_gym.train import GRPOConfig, GRPOTrainer, per_token_advantages
from llm_gym.train.run_folder import SERVED_FOLDER

pytestmark = pytest.mark.vllm

# float32 pinned: the tolerances are fp32's, whatever the CPU's dtype "auto" picks.
SMALL = {
    "env_args": {"task": "chain_sum"}, "groups": 1, "group_size": 4, "max_new_tokens": 24,
    "eval_episodes": 0, "learning_rate": 1e-3, "backend": "vllm", "dtype": "float32",
}  # fmt: skip


def sequences(prompts, samples):
    """Each prompt with its sample, and the mask of the sampled tokens."""
    tokens = [np.concatenate([p, s.tokens]) for p, s in zip(prompts, samples, strict=True)]
    return tokens, [np.arange(len(t)) >= len(p) for t, p in zip(tokens, prompts, strict=True)]


def spread(values, tokens):
    """Each sequence's advantage on each of its tokens, as the update takes them."""
    return per_token_advantages(torch.tensor(values), [len(t) for t in tokens])


def test_the_served_weights_follow_each_update(tmp_path, smol):
    _, tokenizer = smol
    before = set(server_processes())
    trainer = GRPOTrainer(GRPOConfig(**SMALL, iterations=2, out=str(tmp_path), progress=False))
    sampler = trainer.policy.sampler
    initial = TransformersPolicy(smol[0], tokenizer, input_mode="tokens", generate=False)
    prompts = prompts_for(tokenizer)
    try:
        assert sampler.version == trainer.version == 0
        row = trainer.iteration(0)
        assert row["versions"] == [0]  # sampled before the update
        assert sampler.version == trainer.version == 1
        # An update whose advantages are not all zero (a group can be all wrong): the
        # weights move for sure.
        tokens, masks = sequences(prompts, sampler.sample(prompts))
        trainer.update(tokens, masks, spread([1.0, -1, 1], tokens))
        assert sampler.version == trainer.version == 2 and row["sync_seconds"] > 0
        samples = sampler.sample(prompts)
        assert {s.version for s in samples} == {2}
        tokens = [s.tokens for s in samples]
        trained, old = trainer.scorer.score(prompts, tokens), initial.score(prompts, tokens)
        for s, new in zip(samples, trained, strict=True):
            assert np.abs(s.log_probs - new).max() < FP32_TOLERANCE
        moved = max(np.abs(s.log_probs - o).max() for s, o in zip(samples, old, strict=True))
        assert moved > 20 * FP32_TOLERANCE
        row = trainer.iteration(1)
        assert row["versions"] == [2] and sampler.version == 3
    finally:
        trainer.close()
    assert not sampler.server.alive
    assert wait_gone(set(server_processes()) - before) == {}


def test_train_with_vllm_from_the_command_line_resumes(tmp_path, digits):
    # The plumbing of a resumed vLLM run, on the tiny model that answers one digit (GSM8K's
    # reward then varies within a group, so every update moves the weights).
    out = tmp_path / "run"
    flags = [
        "train", "--backend", "vllm", "--model", digits, "--env", "LLMChat-GSM8K-v0",
        "--env-arg", f"dataset={json.dumps(DIGIT_ROWS)}", "--groups", "2", "--group-size", "4",
        "--max-new-tokens", "1", "--eval-episodes", "0", "--save-every", "1", "--out", str(out),
        "--no-progress", "--tis-cap", "2", "--dtype", "float32",
    ]  # fmt: skip
    assert main([*flags, "--iterations", "2"]) == 0
    assert main(["train", "--out", str(out), "--resume", "--iterations", "3", "--no-progress"]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["iteration"] for row in rows] == [0, 1, 2]
    assert [row["versions"] for row in rows] == [[0], [1], [2]]  # resumed at version 2
    # Truncated importance sampling toward vLLM's log-probs (--tis-cap, kept by the resume):
    # in float32 both engines agree to FP32_TOLERANCE, so no weight reaches the cap of 2.
    assert [row["tis_truncated"] for row in rows] == [0.0, 0.0, 0.0]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["backend"] == "vllm" and summary["iterations"] == 3
    # The served copy holds the last update (the last checkpoint's weights), not the start's.
    final = load_model(out / "checkpoint-3")[0].state_dict()
    served = load_model(out / SERVED_FOLDER)[0].state_dict()
    initial = load_model(digits)[0].state_dict()
    for name, tensor in final.items():
        assert np.array_equal(tensor.numpy(), served[name].numpy()), name
    assert not all(np.array_equal(t.numpy(), initial[n].numpy()) for n, t in final.items())


def test_a_lora_run_serves_its_merged_weights_and_its_checkpoint_serves_too(tmp_path, smol):
    _, tokenizer = smol
    config = GRPOConfig(
        **{**SMALL, "learning_rate": 2e-2}, iterations=1, out=str(tmp_path / "train"),
        progress=False, lora_rank=8, lora_target_modules="all-linear",
    )  # fmt: skip
    trainer = GRPOTrainer(config)
    sampler = trainer.policy.sampler
    initial = TransformersPolicy(smol[0], tokenizer, input_mode="tokens", generate=False)
    prompts = prompts_for(tokenizer)
    try:
        tokens, masks = sequences(prompts, sampler.sample(prompts))
        trainer.update(tokens, masks, spread([1.0, -1, 1], tokens))
        samples = sampler.sample(prompts)
        assert {s.version for s in samples} == {1}
        tokens = [s.tokens for s in samples]
        trained, old = trainer.scorer.score(prompts, tokens), initial.score(prompts, tokens)
        for s, new in zip(samples, trained, strict=True):  # the adapter, merged, is served
            assert np.abs(s.log_probs - new).max() < FP32_TOLERANCE
        moved = max(np.abs(s.log_probs - o).max() for s, o in zip(samples, old, strict=True))
        assert moved > 20 * FP32_TOLERANCE
        checkpoint = trainer.save(1)
    finally:
        trainer.close()
    assert (checkpoint / "adapter_model.safetensors").is_file()
    out = tmp_path / "rollout"
    argv = [
        "rollout", "--backend", "vllm", "--model", str(checkpoint), "--env-arg",
        "task=chain_sum", "--episodes", "2", "--num-envs", "2", "--max-new-tokens", "8",
        "--temperature", "0", "--out", str(out), "--no-progress",
    ]  # fmt: skip
    assert main(argv) == 0
    assert (out / SERVED_FOLDER / "model.safetensors").is_file()  # merged for vLLM
    records = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(r["num_tokens"] > 0 for r in records)
