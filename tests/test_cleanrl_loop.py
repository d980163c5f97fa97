"""scripts/cleanrl_loop.py: a plain-Gymnasium GRPO loop through TransformersPolicy."""

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from gsm8k_fixture import FIXTURE  # made-up problems, written to a temp folder

ROOT = Path(__file__).parents[1]


@pytest.fixture(scope="module")
def loop():
    spec = importlib.util.spec_from_file_location(
        "cleanrl_loop", ROOT / "scripts" / "cleanrl_loop.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_group_advantages(loop):
    rewards = np.array([1.0, 0.0, 0.1, 0.1, 0.0, 1.0])
    advantages = loop.group_advantages(rewards, group_size=2)
    np.testing.assert_allclose(advantages, [1, -1, 0, 0, -1, 1], atol=1e-3)


def test_grpo_loss_values_and_clipping(loop):
    mask = torch.tensor([[False, True, True], [False, False, True]])
    old = torch.tensor([[0.0, -1.0, -2.0], [0.0, 0.0, -1.0]])
    advantages = torch.tensor([1.0, -2.0])
    # Ratio 1 everywhere: the loss is -mean(advantages).
    assert float(loop.grpo_loss(old, old, mask, advantages, 0.2)) == pytest.approx(0.5)
    # Row 0's tokens twice as likely: its ratio 2 is clipped to 1.2 (positive advantage).
    new = old + torch.tensor([[0.0, np.log(2), np.log(2)], [0.0, 0.0, 0.0]])
    assert float(loop.grpo_loss(new, old, mask, advantages, 0.2)) == pytest.approx(-(1.2 - 2.0) / 2)


def test_main_runs_two_iterations_with_a_tiny_model(loop):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        stats = loop.main(
            [
                "--model",
                "tiny",
                "--data-dir",
                str(FIXTURE),
                "--iterations",
                "2",
                "--groups",
                "2",
                "--group-size",
                "2",
                "--max-new-tokens",
                "6",
                "--learning-rate",
                "1e-3",
            ]
        )
    finally:
        torch.set_num_threads(threads)
    assert [row["iteration"] for row in stats] == [0, 1]
    for row in stats:
        assert all(math.isfinite(value) for value in row.values())
        assert 0.0 <= row["reward"] <= 1.0 and 1 <= row["response_tokens"] <= 6
        # The sampler's log-probs (raw logits) and get_dist's re-scoring agree.
        assert row["logprob_gap"] < 1e-4


def test_main_updates_with_nonzero_advantages(loop, monkeypatch):
    # A random model earns no GSM8K reward; fixed advantages exercise the update itself.
    monkeypatch.setattr(loop, "group_advantages", lambda r, g: np.array([1.0, 0.5] * 2))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        stats = loop.main(
            [
                "--model",
                "tiny",
                "--data-dir",
                str(FIXTURE),
                "--iterations",
                "1",
                "--groups",
                "2",
                "--group-size",
                "2",
                "--max-new-tokens",
                "4",
            ]
        )
    finally:
        torch.set_num_threads(threads)
    # At ratio 1 (the sampler's log-probs are the scorer's) the loss is -mean(advantages).
    assert stats[0]["loss"] == pytest.approx(-0.75, abs=1e-3)
