"""GSM8K (``LLMChat-GSM8K-v0``): grade-school math word problems, TorchRL's prompt and reward."""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from llm_gym.rewards.answers import check_answer_format, system_prompt
from llm_gym.rewards.gsm8k import GSM8KReward
from llm_gym.rubrics import TaskScore, answer_rubric
from llm_gym.sources.datasets import load_split, task_data
from llm_gym.tasks.task import Task, reward_version

if TYPE_CHECKING:
    from datasets import Dataset

    from llm_gym.sources.datasets import DatasetLike

__all__ = ["GSM8K_ENV_VAR", "GSM8K_HUB_ID", "GSM8K_SYSTEM_PROMPT", "gsm8k_task", "load_gsm8k"]

GSM8K_HUB_ID, GSM8K_CONFIG = "openai/gsm8k", "main"
GSM8K_ENV_VAR = "LLM_GYM_GSM8K_PATH"
_DESCRIPTION = "The user asks a question, and the Assistant solves it."
_HINT = "The answer should be a number."
# TorchRL's GSM8KEnv.SYSTEM_PROMPT, word for word (the tests hold it against TorchRL's text).
GSM8K_SYSTEM_PROMPT = system_prompt(_DESCRIPTION, "tags", _HINT)


def load_gsm8k(split: str = "train", data_dir: str | os.PathLike[str] | None = None) -> Dataset:
    """The GSM8K ``split`` as a ``datasets.Dataset`` with ``question`` and ``answer`` columns,
    from ``data_dir``, else ``$LLM_GYM_GSM8K_PATH``, else the Hub's ``openai/gsm8k``."""
    return load_split("GSM8K", split, data_dir, GSM8K_ENV_VAR, GSM8K_HUB_ID, GSM8K_CONFIG)


def _score(reward: GSM8KReward, response: str, item: Mapping[str, Any]) -> TaskScore:
    score, answer = reward(response, item["answer"]), item["answer"]
    # A given answer, right or wrong, ends a multi-turn episode.
    return TaskScore(score.reward, score.info() | {"answer": answer}, score.reward_answer > 0)


def gsm8k_task(
    reward: GSM8KReward | None = None,
    answer_format: str | None = None,
    *,
    split: str = "train",
    data_dir: str | os.PathLike[str] | None = None,
    dataset: DatasetLike | None = None,
) -> Task:
    """GSM8K word problems; the reward checks the number in the answer (TorchRL's ``GSM8KEnv``).

    ## Description

    Each episode poses one GSM8K question after TorchRL's system prompt (reason in
    ``<think>``, answer in ``<answer>``); ``GSM8KReward`` scores the response against the
    question's solution with TorchRL's ``GSM8KRewardParser`` rules.

    ## Rewards

    1.0 when the answer equals the solution's final number, 0.1 for a wrong answer, 0.0
    without one. ``info``: TorchRL's parts (see ``llm_gym.tasks``) and ``answer`` (the full
    solution, ending in ``#### N``).

    ## Arguments

    - ``reward``: a ``GSM8KReward`` (default: tags mode, 1.0 / 0.1 / 0.0).
    - ``answer_format``: ``"tags"`` (default), ``"boxed"``, ``"hash"`` or ``"last_number"``:
      the prompt asks for it and the reward reads it (or give ``reward`` with that ``mode``).
    - ``split``: ``"train"`` (7473 questions) or ``"test"`` (1319); ``data_dir``: a folder of
      ``train.jsonl``/``test.jsonl`` (default ``$LLM_GYM_GSM8K_PATH``, else the Hub);
      ``dataset``: any other GSM8K-format rows. The data loads when the env is made.

    ## Version History

    - v0: Initial version.

    ## Example

    >>> import gymnasium as gym, llm_gym
    >>> rows = [{"question": "Janet sells 9 eggs at $2. How much?", "answer": "#### 18"}]
    >>> env = gym.make("LLMChat-GSM8K-v0", dataset=rows)
    >>> obs, info = env.reset(seed=0)
    >>> obs, reward, terminated, truncated, info = env.step("<answer>18</answer>")
    >>> reward, terminated, info["success"]
    (1.0, True, True)
    """
    source = task_data(dataset, split, data_dir, load_gsm8k)
    if reward is None:
        reward = GSM8KReward(mode=check_answer_format(answer_format or "tags"))
    if not isinstance(reward, GSM8KReward):
        raise TypeError(f"reward must be a GSM8KReward, got {type(reward).__name__}")
    if answer_format not in (None, reward.mode):
        raise ValueError(
            f"answer_format={answer_format!r} differs from reward.mode={reward.mode!r}: give "
            "one of them"
        )
    return Task(
        source=source,
        prompt=system_prompt(_DESCRIPTION, reward.mode, _HINT),
        reward=answer_rubric(functools.partial(_score, reward), reward.mode),
        answer_format=reward.mode,
        field_map={"question": "query"},
        required_fields=("answer",),
        reward_version=reward_version("1"),
    )
