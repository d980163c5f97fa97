"""Nothing lost, nothing silently wrong: a step happens whole or not at all, a finished
episode takes no more steps, hostile text is scored fast."""

import gymnasium as gym
import numpy as np
import pytest

import llm_gym  # noqa: F401  (registers the ids)
from llm_gym.envs import DatasetChatEnv
from llm_gym.rewards import extract_answer, score_gsm8k

ROWS = [{"question": "9*2?", "answer": "#### 18"}]


def state(env):
    base = env.unwrapped
    return (
        base.history.to_chats(),
        base._text,
        None if base._tokens is None else base._tokens.copy(),
    )


def test_a_step_that_cannot_be_tokenized_changes_nothing(gpt2_tokenizer):
    env = gym.make(
        "LLMChat-GSM8K-v0", dataset=ROWS, input_mode="tokens", tokenizer=gpt2_tokenizer,
        observation_keys=("tokens", "text", "history"), max_turns=3,
    )  # fmt: skip
    env.reset(seed=0)
    before = state(env)
    with pytest.raises(Exception):  # noqa: B017 (the tokenizer's own error for a lone surrogate)
        env.step("\ud800")
    after = state(env)
    assert before[0] == after[0] and before[1] == after[1]
    assert np.array_equal(before[2], after[2])
    obs, reward, terminated, *_ = env.step("<answer>18</answer>")
    assert (reward, terminated) == (1.0, True) and obs["history"][-1][
        "content"
    ] == "<answer>18</answer>"


def test_a_reward_that_rejects_its_sample_changes_nothing():
    env = gym.make("LLMChat-GSM8K-v0", dataset=[{"question": "q", "answer": 18}], max_turns=2)
    env.reset(seed=0)
    with pytest.raises(TypeError, match="answer must be a str, got int"):
        env.step("<answer>18</answer>")
    assert env.unwrapped.history.roles == ["system", "user"] and env.unwrapped._turn == 0


@pytest.mark.parametrize("max_turns", [1, 2])
def test_a_finished_episode_takes_no_more_steps(max_turns):
    env = DatasetChatEnv([{"query": "hi"}], max_turns=max_turns)
    env.reset(seed=0)
    for _ in range(max_turns):
        *_, terminated, truncated, _ = env.step("x")
    assert terminated or truncated
    with pytest.raises(gym.error.ResetNeeded, match="the episode has ended"):
        env.step("again")
    assert len(env.history) == 1 + max_turns  # the refused step appended nothing
    env.reset()
    assert env.step("x")[0]["history"][-1]["content"] == "x"


def test_gsm8k_pays_once_per_episode():
    env = gym.make("LLMChat-GSM8K-v0", dataset=ROWS)
    env.reset(seed=0)
    assert env.step("<answer>18</answer>")[1] == 1.0
    with pytest.raises(gym.error.ResetNeeded):
        env.step("<answer>18</answer>")


@pytest.mark.parametrize(
    "hostile", ["<answer>" * 20_000, "<think>" * 20_000, "\\boxed{" * 20_000, "####" * 40_000]
)
def test_hostile_text_is_scored_in_linear_time(hostile):
    # These took 27 s and 140 s with backtracking regexes; each mode is now one pass.
    assert score_gsm8k(hostile, "#### 1").reward == 0.0
    assert all(extract_answer(hostile, mode) is None for mode in ("tags", "boxed", "hash"))
