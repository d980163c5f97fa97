"""MATH (``LLMChat-MATH-v0``): competition problems, answers checked by ``math-verify``,
TorchRL's prompt; the reward is a ``Rubric`` (``answer_rubric``: the gate ``format`` and the
reward ``right``, ``MATHReward``'s 1.0 / 0.1 / 0.0)."""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from llm_gym.rewards.answers import system_prompt
from llm_gym.rewards.math import MATHReward, boxed_answer
from llm_gym.rubrics import TaskScore, answer_rubric
from llm_gym.sources.datasets import load_split, task_data
from llm_gym.tasks.task import Task, reward_version

if TYPE_CHECKING:
    from datasets import Dataset

    from llm_gym.sources.datasets import DatasetLike

__all__ = [
    "MATH_ENV_VAR",
    "MATH_HUB_ID",
    "MATH_SYSTEM_PROMPT",
    "load_math",
    "math_task",
]

MATH_HUB_ID = "DigitalLearningGmbH/MATH-lighteval"
MATH_ENV_VAR = "LLM_GYM_MATH_PATH"
_DESCRIPTION = "The user asks a math problem, and the Assistant solves it."
_HINT = "The answer should be a mathematical expression (use LaTeX if needed)."
# TorchRL's MATHEnv.SYSTEM_PROMPT, word for word.
MATH_SYSTEM_PROMPT = (
    f"A conversation between User and Assistant. {_DESCRIPTION}\n"
    "The assistant first thinks about the reasoning process in the mind and then provides "
    "the user with the answer.\nThe reasoning process and answer are enclosed within "
    "<think></think> and <answer></answer> tags, respectively, i.e.,\n<think>reasoning "
    f"process here</think> <answer>answer here</answer>.\n{_HINT}"
)


def load_math(split: str = "train", data_dir: str | os.PathLike[str] | None = None) -> Dataset:
    """The MATH ``split`` as a ``datasets.Dataset`` with ``problem`` and ``solution`` columns,
    from ``data_dir``, else ``$LLM_GYM_MATH_PATH``, else the Hub."""
    return load_split("MATH", split, data_dir, MATH_ENV_VAR, MATH_HUB_ID, "default")


def _score(reward: MATHReward, response: str, item: Mapping[str, Any]) -> TaskScore:
    score = reward(response, item["solution"])
    info = score.info() | {"answer": boxed_answer(item["solution"])}
    return TaskScore(score.reward, info, answered=score.reward_answer > 0)


def math_task(
    *,
    split: str = "train",
    data_dir: str | os.PathLike[str] | None = None,
    dataset: DatasetLike | None = None,
    answer_format: str = "tags",
    correct_reward: float = 1.0,
    format_reward: float = 0.1,
) -> Task:
    """MATH competition problems; the answer must equal the solution's last ``\\boxed{}``
    (TorchRL's ``MATHEnv``).

    ## Description

    Each episode poses one MATH problem after TorchRL's system prompt; ``math-verify``
    compares the answer with the solution's boxed one (symbolically: ``0.5`` equals
    ``\\frac{1}{2}``).

    ## Rewards

    ``correct_reward`` (1.0) for an equivalent answer, ``format_reward`` (0.1) for another
    answer, 0.0 for none, and 0.0 for an answer refused (over 512 characters, or a number
    too large to compute such as ``9^{9^{9}}``) or whose check ran past 5 s, with
    ``info["reason"]`` saying why. The reward is a ``Rubric`` (``answer_rubric``): the gate
    ``format`` (an answer in ``answer_format``) and the reward ``right`` (the value above).
    ``info``: the parts' values, TorchRL's parts and ``answer`` (the boxed ground truth); at
    reset, the row's other fields (``solution``, ``level``/``type`` where present).

    ## Arguments

    - ``split``: ``"train"`` (default) or ``"test"``; ``data_dir``: a folder of
      ``train.jsonl``/``test.jsonl`` (default ``$LLM_GYM_MATH_PATH``, else the Hub's
      ``DigitalLearningGmbH/MATH-lighteval``); ``dataset``: other ``problem``/``solution`` rows.
    - ``answer_format``: ``"tags"`` (TorchRL's prompt, default), ``"boxed"``, ``"hash"`` or
      ``"last_number"``; ``correct_reward`` / ``format_reward``: the reward values.

    ## Version History

    - v0: Initial version.

    ## Example

    >>> import gymnasium as gym, llm_gym
    >>> rows = [{"problem": "What is half of 1?", "solution": r"It is $\\boxed{\\frac{1}{2}}$."}]
    >>> env = gym.make("LLMChat-MATH-v0", dataset=rows)
    >>> obs, info = env.reset(seed=0)
    >>> obs, reward, terminated, truncated, info = env.step("<answer>0.5</answer>")
    >>> reward, info["success"], info["answer"]
    (1.0, True, '\\\\frac{1}{2}')
    """
    source = task_data(dataset, split, data_dir, load_math)
    reward = MATHReward(answer_format, correct_reward, format_reward)
    prompt = MATH_SYSTEM_PROMPT
    if answer_format != "tags":
        prompt = system_prompt(_DESCRIPTION, answer_format, _HINT)
    return Task(
        source=source,
        prompt=prompt,
        # numeric=False: MATHReward reads a "hash" answer as the rest of its line.
        reward=answer_rubric(functools.partial(_score, reward), answer_format, numeric=False),
        answer_format=answer_format,
        field_map={"problem": "query"},
        required_fields=("solution",),
        reward_version=reward_version("1", "math-verify"),
    )
