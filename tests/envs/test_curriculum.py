"""The difficulty curriculum over the procedural tasks' levels, single and vector."""

import gymnasium as gym
import pytest
from test_tasks import right_countdown_answer

import llm_gym  # noqa: F401  (registers the ids)
from llm_gym.wrappers import DifficultyCurriculum
from llm_gym.wrappers import vector as vector_wrappers


def play(env, right: bool):
    _, info = env.reset()
    answer = right_countdown_answer(info["numbers"], info["target"]) if right else "0"
    return env.step(f"<answer>{answer}</answer>")[-1]


def test_curriculum_raises_and_lowers_the_level():
    env = DifficultyCurriculum(
        gym.make("LLMChat-Countdown-v0", level=0, seed=0), window=3, raise_at=1.0, lower_below=0.5
    )
    env.reset(seed=0)
    levels = [play(env, right=True)["level"] for _ in range(3)]
    assert levels == [0, 0, 0] and env.level == 1 and env.unwrapped.level == 1
    assert len(env.reset()[1]["numbers"]) == 3 and env.reset()[1]["level"] == 1
    for _ in range(3):
        play(env, right=False)
    assert env.level == env.unwrapped.level == 0


def test_vector_curriculum_moves_every_sub_env():
    for mode in ("vector_entry_point", "sync"):
        envs = gym.make_vec(
            "LLMChat-Countdown-v0", num_envs=2, vectorization_mode=mode, level=0, seed=0
        )
        envs = vector_wrappers.DifficultyCurriculum(envs, window=2, raise_at=0.0, lower_below=0.0)
        obs, info = envs.reset(seed=0)
        assert info["level"].tolist() == [0, 0]
        envs.step(["<answer>1</answer>"] * 2)
        if mode == "sync":
            assert envs.env.get_attr("level") == (1, 1)
        else:
            assert envs.unwrapped.level == 1
        *_, info = envs.step(["<answer>1</answer>"] * 2)
        assert info["level"].tolist() == [1, 1]


def test_curriculum_errors_name_the_argument():
    countdown = gym.make("LLMChat-Countdown-v0", seed=0)
    with pytest.raises(
        ValueError, match="env must be a task with difficulty levels .* got DatasetChatEnv"
    ):
        DifficultyCurriculum(
            gym.make("LLMChat-GSM8K-v0", dataset=[{"question": "q", "answer": "1"}])
        )
    with pytest.raises(ValueError, match="window must be an int >= 1 \\(episodes\\), got 0"):
        DifficultyCurriculum(countdown, window=0)
    with pytest.raises(ValueError, match="raise_at must be a number in \\[0, 1\\], got 1.5"):
        DifficultyCurriculum(countdown, raise_at=1.5)
    with pytest.raises(
        ValueError, match="lower_below \\(0.9\\) must not exceed raise_at \\(0.8\\)"
    ):
        DifficultyCurriculum(countdown, lower_below=0.9)
