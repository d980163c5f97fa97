"""GSM8K as a task: grade-school math word problems, TorchRL's prompt and reward.

The task is data plus a reward: the GSM8K rows (``load_gsm8k``), TorchRL's system prompt,
the field map ``question -> query``, and ``llm_gym.rewards.GSM8KReward`` applied to the
row's ``answer``. ``make_gsm8k_env`` puts them in a ``DatasetChatEnv``; ``gsm8k_task`` gives
them as ``DatasetChatEnv`` arguments for any other data source.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import Any

from llm_gym.envs.dataset import DatasetChatEnv, TaskScore
from llm_gym.envs.vector import DatasetChatVectorEnv
from llm_gym.rewards.answers import check_answer_format
from llm_gym.rewards.gsm8k import GSM8KReward
from llm_gym.tasks._build import task_env
from llm_gym.tasks._splits import SPLITS, load_split
from llm_gym.tasks.formats import system_prompt

__all__ = [
    "GSM8K_ENV_VAR",
    "GSM8K_HUB_ID",
    "GSM8K_SYSTEM_PROMPT",
    "gsm8k_task",
    "load_gsm8k",
    "make_gsm8k_env",
    "make_gsm8k_vector_env",
]

GSM8K_HUB_ID, GSM8K_CONFIG = "openai/gsm8k", "main"
GSM8K_ENV_VAR = "LLM_GYM_GSM8K_PATH"


def load_gsm8k(split: str = "train", data_dir: str | os.PathLike[str] | None = None) -> Any:
    """The GSM8K ``split`` as a ``datasets.Dataset`` with ``question`` and ``answer`` columns.

    From ``data_dir`` (a folder holding ``train.jsonl``/``test.jsonl``) if given, else from
    ``$LLM_GYM_GSM8K_PATH`` if set, else from the Hub's ``openai/gsm8k`` (config ``main``).
    """
    return load_split("GSM8K", split, data_dir, GSM8K_ENV_VAR, GSM8K_HUB_ID, GSM8K_CONFIG)


_DESCRIPTION = "The user asks a question, and the Assistant solves it."
_HINT = "The answer should be a number."
# TorchRL's GSM8KEnv.SYSTEM_PROMPT, word for word (the tests hold it against TorchRL's text).
GSM8K_SYSTEM_PROMPT = system_prompt(_DESCRIPTION, "tags", _HINT)


def _score(reward: GSM8KReward, response: str, sample: Mapping[str, Any]) -> TaskScore:
    answer = sample["answer"]
    score = reward(response, answer)
    info = score.info() | {"answer": answer}
    # A given answer, right or wrong, ends a multi-turn episode.
    return TaskScore(score.reward, info, answered=score.reward_answer > 0)


def gsm8k_task(
    reward: GSM8KReward | None = None, answer_format: str | None = None
) -> dict[str, Any]:
    """GSM8K's prompt, field map and reward, as ``DatasetChatEnv`` keyword arguments.

    ``answer_format`` picks the prompt and the reward's extraction (default: the reward's
    mode, ``"tags"``). For GSM8K-format rows from any source, e.g.
    ``DatasetChatEnv.from_dataloader(loader, **gsm8k_task())``; the reward is picklable, so
    async vector envs can take it.
    """
    if reward is None:
        reward = GSM8KReward(mode=check_answer_format(answer_format or "tags"))
    if not isinstance(reward, GSM8KReward):
        raise TypeError(f"reward must be a GSM8KReward, got {type(reward).__name__}")
    if answer_format is not None and answer_format != reward.mode:
        raise ValueError(
            f"answer_format={answer_format!r} differs from reward.mode={reward.mode!r}: give "
            "one of them"
        )
    prompt = GSM8K_SYSTEM_PROMPT
    if reward.mode != "tags":
        prompt = system_prompt(_DESCRIPTION, reward.mode, _HINT)
    return {
        "system_prompt": prompt,
        "field_map": {"question": "query"},
        "reward": functools.partial(_score, reward),
        "required_fields": ("answer",),
    }


def make_gsm8k_env(
    *,
    split: str = "train",
    data_dir: str | os.PathLike[str] | None = None,
    dataset: Any = None,
    reward: GSM8KReward | None = None,
    answer_format: str | None = None,
    **env_kwargs: Any,
) -> DatasetChatEnv:
    """GSM8K math word problems; the reward checks the number in the ``<answer>`` tag.

    ## Description

    The Gymnasium form of TorchRL's ``GSM8KEnv``. Each episode poses one GSM8K question
    after TorchRL's system prompt, which asks the model to reason inside ``<think></think>``
    and answer inside ``<answer></answer>``. The response is scored against the question's
    solution by ``llm_gym.rewards.GSM8KReward`` (TorchRL's ``GSM8KRewardParser`` rules).

    ## Action Space

    As ``ChatEnv``: a ``str`` (or token ids in ``"tokens"`` mode), or a ``Response``.

    ## Observation Space

    As ``ChatEnv``: a ``Dict`` with the prompt as ``history``, ``text`` and/or ``tokens``.

    ## Rewards

    1.0 when the normalized ``<answer>`` equals the solution's final number, 0.1 when an
    answer was given but is wrong, 0.0 without one (``reward=GSM8KReward(...)`` changes
    the values or the extraction mode). ``info`` holds the parts ``reward_answer``,
    ``reward_think``, ``reward_right``, ``reward``, ``success`` and the ``answer`` field.

    ## Starting State

    ``[system, user question]``; ``info["answer"]`` is the full solution, ending in
    ``#### N``.

    ## Episode End

    With ``max_turns=1`` (default) the response ends the episode with ``terminated=True``.
    With ``max_turns > 1`` the episode terminates at the first response holding an answer,
    else it is truncated after ``max_turns`` responses.

    ## Arguments

    - ``split``: ``"train"`` (default, 7473 questions) or ``"test"`` (1319).
    - ``data_dir``: a folder holding ``train.jsonl``/``test.jsonl``; default
      ``$LLM_GYM_GSM8K_PATH``, else the Hub's ``openai/gsm8k``.
    - ``dataset``: any other data ``DatasetChatEnv`` accepts, with ``question``/``answer``.
    - ``reward``: a ``GSM8KReward`` (default: tags mode, 1.0 / 0.1 / 0.0).
    - ``answer_format``: ``"tags"`` (TorchRL's prompt, default), ``"boxed"``, ``"hash"`` or
      ``"last_number"``: the prompt asks for it and the reward extracts it.
    - ``env_kwargs``: ``DatasetChatEnv``'s other arguments (``shuffle``, ``seed``,
      ``repeats``, ``group_repeats``, ``system_prompt``, ``max_turns``, ``input_mode``,
      ``tokenizer``, ...).

    ## Version History

    - v0: Initial version.

    ## Example

    >>> import gymnasium as gym, llm_gym
    >>> rows = [{"question": "Janet has 9 eggs and sells them for $2 each. How much?",
    ...          "answer": "9 * 2 = <<9*2=18>>18\\n#### 18"}]
    >>> env = gym.make("LLMChat-GSM8K-v0", dataset=rows)
    >>> obs, info = env.reset(seed=0)
    >>> [m["role"] for m in obs["history"]], info["answer"][-7:]
    (['system', 'user'], '#### 18')
    >>> obs, reward, terminated, truncated, info = env.step("<think>9*2</think><answer>18</answer>")
    >>> reward, terminated, truncated, info["success"]
    (1.0, True, False, True)
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if dataset is not None and data_dir is not None:
        raise ValueError("pass either dataset= or data_dir=, not both")
    task = gsm8k_task(reward, answer_format)
    if dataset is None:
        dataset = load_gsm8k(split, data_dir)
    return task_env(dataset, task, env_kwargs, split=split)


def make_gsm8k_vector_env(num_envs: int = 1, **kwargs: Any) -> DatasetChatVectorEnv:
    """``LLMChat-GSM8K-v0``'s ``vector_entry_point``: N GSM8K conversations in one env.

    >>> import gymnasium as gym, llm_gym
    >>> rows = [{"question": f"{i}+{i}?", "answer": f"#### {2 * i}"} for i in range(4)]
    >>> envs = gym.make_vec("LLMChat-GSM8K-v0", num_envs=2, dataset=rows, repeats=2,
    ...                     group_repeats=True)
    >>> obs, info = envs.reset(seed=0)
    >>> obs["history"][0] == obs["history"][1], list(info["answer"]) == [info["answer"][0]] * 2
    (True, True)
    """
    return DatasetChatVectorEnv(make_gsm8k_env(**kwargs), num_envs)
