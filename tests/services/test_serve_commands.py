"""``llm-gym rollout`` and ``llm-gym train`` on ``LLMChat-OpenEnv-v0`` against a served env
(``llm-gym serve``'s server on loopback): the vector env, the KL wrapper, the asynchronous
driver, Ray's env workers and GRPO all play an OpenEnv server as they play an in-process
task."""

import json
import os
import subprocess
import sys

import pytest

from llm_gym.integrations.openenv_server import Server

# `llm-gym serve` started as a command, and rollouts and a training against it.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served():
    server = Server("LLMChat-Countdown-v0", {"level": 0}, port=0, max_sessions=16)
    server.start()
    yield server.url
    server.stop()


def cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "llm_gym", *args, "--threads", "1", "--no-progress"],
        capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300,
    )  # fmt: skip


def episodes(out):
    return [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]


DRIVERS = {"sync": [], "async": ["--async"], "ray": ["--ray", "local", "--workers", "2"]}


@pytest.mark.parametrize(
    "driver", [pytest.param(d, marks=[pytest.mark.ray] if d == "ray" else []) for d in DRIVERS]
)
def test_rollout_plays_a_served_env_with_the_kl_penalty(served, model_dirs, tmp_path, driver):
    out = tmp_path / driver
    result = cli(
        "rollout", "--env", "LLMChat-OpenEnv-v0", "--env-arg", f"base_url={served}",
        "--model", model_dirs[0], "--ref-model", model_dirs[1], "--kl-coef", "0.5",
        "--num-envs", "2", "--episodes", "4", "--max-new-tokens", "6", "--out", str(out),
        *DRIVERS[driver],
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    records = episodes(out)
    assert len(records) == 4 and len({r["episode_seed"] for r in records}) == 4
    for r in records:
        assert r["prompt"][-1]["content"].startswith("Using the numbers")  # the served task's
        assert r["task"] == served and r["reward_task"] in (0.0, 0.1, 1.0)
        assert r["kl_sum"] != 0.0  # a different reference: KL is charged on the served turns
        assert r["reward"] == pytest.approx(r["reward_task"] - 0.5 * r["kl_sum"], abs=1e-4)


def test_train_runs_grpo_on_a_served_env(served, model_dirs, tmp_path):
    out = tmp_path / "train"
    result = cli(
        "train", "--env", "LLMChat-OpenEnv-v0", "--env-arg", f"base_url={served}",
        "--model", model_dirs[0], "--iterations", "1", "--groups", "1", "--group-size", "2",
        "--max-new-tokens", "6", "--eval-episodes", "0", "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (row,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert row["iteration"] == 0 and row["versions"] == [0]
    served_rewards = (0.0, 0.1, 1.0)  # Countdown's, as the server pays them
    assert any(
        row["reward"] == pytest.approx((a + b) / 2) for a in served_rewards for b in served_rewards
    )
    assert row["response_tokens"] <= 6 and (out / "checkpoint-1").is_dir()
