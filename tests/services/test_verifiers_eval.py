"""verifiers' own evaluation (``vf-eval``, its env server and workers) of llm_gym envs
against llm_gym's vLLM server on the CPU (issue 39, item 4): each rollout's reward equals
llm_gym's return for the same replies played in-process."""

import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest
from gsm8k_fixture import FIXTURE

import llm_gym  # noqa: F401  (registers the ids)

pytest.importorskip("verifiers")

from llm_gym.samplers.vllm import SERVED_NAME  # noqa: E402

pytestmark = pytest.mark.vllm
VF_EVAL = Path(sys.executable).parent / "vf-eval"


@pytest.fixture(scope="module")
def server(vllm_default):
    """The test run's vLLM server of the default model (fp32, 2048 tokens of context)."""
    return vllm_default.server


def vf_eval(server, out, gym_args, examples=2, rollouts=2):
    """``vf-eval llm_gym.integrations.verifiers`` against ``server``: its results rows."""
    command = [str(VF_EVAL), "llm_gym.integrations.verifiers", "-a", json.dumps(gym_args)]
    command += ["-m", SERVED_NAME, "-b", f"{server.url}/v1", "-k", "LLM_GYM_TEST_KEY"]
    command += ["-n", str(examples), "-r", str(rollouts), "-t", "48", "-T", "1.0"]
    command += ["-s", "-o", str(out), "-d"]
    environment = {**os.environ, "LLM_GYM_TEST_KEY": "unused", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (results,) = Path(out).glob("evals/*/*/results.jsonl")
    return [json.loads(line) for line in results.read_text().splitlines()]


def replay(gym_id, args, seed, completion):
    """The completion's replies played in ``gym.make(gym_id)`` reset with ``seed``: the
    return, whether the episode ended, and the env's last history."""
    env = gym.make(gym_id, **args)
    observation, _ = env.reset(seed=seed)
    total, done = 0.0, False
    for message in completion:
        if message["role"] != "assistant":
            continue
        assert not done, "verifiers played on after the env's end"
        observation, reward, terminated, truncated, _ = env.step(message["content"])
        total += reward
        done = terminated or truncated
    env.close()
    return total, done, observation["history"]


@pytest.mark.parametrize(
    ("gym_args", "multi_turn"),
    [
        ({"gym_id": "LLMChat-TextArena-v0", "game": "GuessTheNumber-v0"}, True),
        ({"gym_id": "LLMChat-GSM8K-v0", "data_dir": str(FIXTURE), "split": "test"}, False),
    ],
    ids=["game", "gsm8k"],
)
def test_vf_eval_scores_llm_gym_envs_with_their_own_reward(server, tmp_path, gym_args, multi_turn):
    rows = vf_eval(server, tmp_path, gym_args)
    assert len(rows) == 4  # 2 examples x 2 rollouts
    gym_id, args = gym_args["gym_id"], {k: v for k, v in gym_args.items() if k != "gym_id"}
    for row in rows:
        assert row["error"] is None and row["info"]["gym_id"] == gym_id
        replies = [m for m in row["completion"] if m["role"] == "assistant"]
        assert replies and all(isinstance(m["content"], str) for m in replies)
        total, done, history = replay(gym_id, args, row["info"]["seed"], row["completion"])
        assert row["reward"] == pytest.approx(total)
        assert row["metrics"]["env_reward"] == pytest.approx(total)
        if row["stop_condition"] == "has_final_env_response":
            assert done  # verifiers stopped where the env ended the episode
        # every message verifiers saw after the prompt is the env's conversation
        played = [(m["role"], m["content"]) for m in list(history)[len(row["prompt"]) :]]
        assert [(m["role"], m["content"]) for m in row["completion"]][: len(played)] == played
        if not multi_turn:
            assert len(replies) == 1 and done
