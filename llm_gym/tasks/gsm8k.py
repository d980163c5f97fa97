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
from pathlib import Path
from typing import Any

from llm_gym.envs.data_sources import load_hub_dataset, load_local_dataset
from llm_gym.envs.dataset import DatasetChatEnv, TaskScore
from llm_gym.envs.vector import DatasetChatVectorEnv
from llm_gym.rewards.gsm8k import GSM8KReward

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
SPLITS = ("train", "test")


def load_gsm8k(split: str = "train", data_dir: str | os.PathLike[str] | None = None) -> Any:
    """The GSM8K ``split`` as a ``datasets.Dataset`` with ``question`` and ``answer`` columns.

    From ``data_dir`` (a folder holding ``train.jsonl``/``test.jsonl``) if given, else from
    ``$LLM_GYM_GSM8K_PATH`` if set, else from the Hub's ``openai/gsm8k`` (config ``main``).
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if data_dir is not None:
        origin = f"data_dir={str(data_dir)!r}"
    elif os.environ.get(GSM8K_ENV_VAR):
        data_dir, origin = (
            os.environ[GSM8K_ENV_VAR],
            f"${GSM8K_ENV_VAR}={os.environ[GSM8K_ENV_VAR]!r}",
        )
    if data_dir is not None:
        path = Path(data_dir).expanduser() / f"{split}.jsonl"
        if not path.is_file():
            raise FileNotFoundError(
                f"GSM8K's {split!r} split was not found: {origin} has no file {path.name} "
                f"({path}). Point data_dir= or ${GSM8K_ENV_VAR} at a folder holding "
                f"train.jsonl and test.jsonl, or leave both unset to load {GSM8K_HUB_ID!r} "
                "from the Hugging Face Hub."
            )
        return load_local_dataset(path)
    try:
        return load_hub_dataset(GSM8K_HUB_ID, GSM8K_CONFIG, split)
    except Exception as error:  # any Hub failure gets the same advice
        raise FileNotFoundError(
            f"GSM8K could not be loaded from the Hugging Face Hub ({GSM8K_HUB_ID!r}, config "
            f"{GSM8K_CONFIG!r}): {str(error).rstrip('.')}. Offline, pass data_dir= (or set "
            f"${GSM8K_ENV_VAR}) to "
            "a folder holding train.jsonl and test.jsonl."
        ) from error


GSM8K_SYSTEM_PROMPT = (
    "A conversation between User and Assistant. The user asks a question, and the "
    "Assistant solves it.\nThe assistant first thinks about the reasoning process in the "
    "mind and then provides the user with the answer.\nThe reasoning process and answer "
    "are enclosed within <think></think> and <answer></answer> tags, respectively,\ni.e., "
    "<think>reasoning process here</think> <answer>answer here</answer>. The answer "
    "should be a number."
)


def _score(reward: GSM8KReward, response: str, sample: Mapping[str, Any]) -> TaskScore:
    answer = sample["answer"]
    score = reward(response, answer)
    info = {  # not score.as_dict(): dataclasses.asdict deep-copies, 4x slower
        "reward_answer": score.reward_answer,
        "reward_think": score.reward_think,
        "reward_right": score.reward_right,
        "reward": score.reward,
        "success": score.success,
        "answer": answer,
    }
    # A given answer, right or wrong, ends a multi-turn episode.
    return TaskScore(score.reward, info, answered=score.reward_answer > 0)


def gsm8k_task(reward: GSM8KReward | None = None) -> dict[str, Any]:
    """GSM8K's prompt, field map and reward, as ``DatasetChatEnv`` keyword arguments.

    For GSM8K-format rows from any source, e.g. ``DatasetChatEnv.from_dataloader(loader,
    **gsm8k_task())``; the reward is picklable, so async vector envs can take it.
    """
    if reward is None:
        reward = GSM8KReward()
    if not isinstance(reward, GSM8KReward):
        raise TypeError(f"reward must be a GSM8KReward, got {type(reward).__name__}")
    return {
        "system_prompt": GSM8K_SYSTEM_PROMPT,
        "field_map": {"question": "query"},
        "reward": functools.partial(_score, reward),
    }


def make_gsm8k_env(
    *,
    split: str = "train",
    data_dir: str | os.PathLike[str] | None = None,
    dataset: Any = None,
    reward: GSM8KReward | None = None,
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
    task = gsm8k_task(reward)
    if env_kwargs.get("system_prompt", "") is None:
        del env_kwargs["system_prompt"]  # None: TorchRL's prompt, as before
    if dataset is None:
        dataset = load_gsm8k(split, data_dir)
    return DatasetChatEnv(dataset, split=split, **(task | env_kwargs))


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
