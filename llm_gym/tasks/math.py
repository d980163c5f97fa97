"""MATH as a task: competition problems, answers checked by ``math-verify``, TorchRL's prompt.

Data: a folder of ``train.jsonl``/``test.jsonl`` with MATH's ``problem`` and ``solution``
fields (``data_dir=`` or ``$LLM_GYM_MATH_PATH``), else the Hub's
``DigitalLearningGmbH/MATH-lighteval`` (TorchRL's default). The answer is the solution's last
``\\boxed{}``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import Any

from llm_gym.envs.dataset import DatasetChatEnv, TaskScore
from llm_gym.envs.vector import DatasetChatVectorEnv
from llm_gym.rewards.math import MATHReward, boxed_answer
from llm_gym.tasks._build import task_env
from llm_gym.tasks._splits import SPLITS, load_split
from llm_gym.tasks.formats import system_prompt

__all__ = [
    "MATH_ENV_VAR",
    "MATH_HUB_ID",
    "MATH_SYSTEM_PROMPT",
    "load_math",
    "make_math_env",
    "make_math_vector_env",
]

MATH_HUB_ID = "DigitalLearningGmbH/MATH-lighteval"
MATH_ENV_VAR = "LLM_GYM_MATH_PATH"
_DESCRIPTION = "The user asks a math problem, and the Assistant solves it."
# TorchRL's MATHEnv.SYSTEM_PROMPT, word for word.
MATH_SYSTEM_PROMPT = (
    f"A conversation between User and Assistant. {_DESCRIPTION}\n"
    "The assistant first thinks about the reasoning process in the mind and then provides "
    "the user with the answer.\nThe reasoning process and answer are enclosed within "
    "<think></think> and <answer></answer> tags, respectively, i.e.,\n<think>reasoning "
    "process here</think> <answer>answer here</answer>.\nThe answer should be a mathematical "
    "expression (use LaTeX if needed)."
)


def load_math(split: str = "train", data_dir: str | os.PathLike[str] | None = None) -> Any:
    """The MATH ``split`` as a ``datasets.Dataset`` with ``problem`` and ``solution`` columns.

    From ``data_dir`` if given, else ``$LLM_GYM_MATH_PATH``, else the Hub.
    """
    return load_split("MATH", split, data_dir, MATH_ENV_VAR, MATH_HUB_ID, "default")


def _score(reward: MATHReward, response: str, sample: Mapping[str, Any]) -> TaskScore:
    solution = sample["solution"]
    score = reward(response, solution)
    info = score.info() | {"answer": boxed_answer(solution)}
    return TaskScore(score.reward, info, answered=score.reward_answer > 0)


def make_math_env(
    *,
    split: str = "train",
    data_dir: str | os.PathLike[str] | None = None,
    dataset: Any = None,
    answer_format: str = "tags",
    correct_reward: float = 1.0,
    format_reward: float = 0.1,
    **env_kwargs: Any,
) -> DatasetChatEnv:
    """MATH competition problems; the answer must equal the solution's boxed one.

    ## Description

    The Gymnasium form of TorchRL's ``MATHEnv``. Each episode poses one MATH problem after
    TorchRL's system prompt; the policy's answer is compared with the solution's last
    ``\\boxed{}`` by ``math-verify`` (symbolic equivalence: ``0.5`` equals ``\\frac{1}{2}``).

    ## Action Space

    As ``ChatEnv``: a ``str`` (or token ids in ``"tokens"`` mode), or a ``Response``.

    ## Observation Space

    As ``ChatEnv``: a ``Dict`` with the prompt as ``history``, ``text`` and/or ``tokens``.

    ## Rewards

    ``correct_reward`` (1.0) for an equivalent answer, ``format_reward`` (0.1) for another
    answer, 0.0 for none. ``info`` holds ``reward_answer``, ``reward_think``,
    ``reward_right``, ``reward``, ``success`` and ``answer`` (the boxed ground truth).

    ## Starting State

    ``[system, user problem]``; the reset ``info`` holds the row's other fields
    (``solution``, and ``level``/``type`` where the data has them).

    ## Episode End

    With ``max_turns=1`` (default) the response ends the episode with ``terminated=True``;
    with more turns, the first answer does.

    ## Arguments

    - ``split``: ``"train"`` (default) or ``"test"``.
    - ``data_dir``: a folder holding ``train.jsonl``/``test.jsonl``; default
      ``$LLM_GYM_MATH_PATH``, else the Hub's ``DigitalLearningGmbH/MATH-lighteval``.
    - ``dataset``: any other data ``DatasetChatEnv`` accepts, with ``problem``/``solution``.
    - ``answer_format``: ``"tags"`` (TorchRL's prompt, default), ``"boxed"``, ``"hash"`` or
      ``"last_number"``.
    - ``correct_reward`` / ``format_reward``: the reward values.
    - ``env_kwargs``: ``DatasetChatEnv``'s other arguments (``seed``, ``repeats``,
      ``group_repeats``, ``input_mode``, ``tokenizer``, ``assistant_prefix``, ...).

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
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if dataset is not None and data_dir is not None:
        raise ValueError("pass either dataset= or data_dir=, not both")
    reward = MATHReward(answer_format, correct_reward, format_reward)
    prompt = (
        MATH_SYSTEM_PROMPT
        if answer_format == "tags"
        else system_prompt(
            _DESCRIPTION,
            answer_format,
            "The answer should be a mathematical expression (use LaTeX if needed).",
        )
    )
    task = {
        "system_prompt": prompt,
        "field_map": {"problem": "query"},
        "reward": functools.partial(_score, reward),
        "required_fields": ("solution",),
    }
    if dataset is None:
        dataset = load_math(split, data_dir)
    return task_env(dataset, task, env_kwargs, split=split)


def make_math_vector_env(num_envs: int = 1, **kwargs: Any) -> DatasetChatVectorEnv:
    """``LLMChat-MATH-v0``'s ``vector_entry_point``: N MATH conversations in one env."""
    return DatasetChatVectorEnv(make_math_env(**kwargs), num_envs)
