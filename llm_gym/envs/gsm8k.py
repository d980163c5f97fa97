"""``GSM8KEnv``: grade-school math word problems, scored on the ``<answer>`` the policy gives."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import datasets

from llm_gym.envs.data_sources import load_hub_dataset, load_local_dataset
from llm_gym.envs.dataset import DatasetChatEnv
from llm_gym.envs.vector import DatasetChatVectorEnv
from llm_gym.rewards.gsm8k import GSM8KReward
from llm_gym.spaces import MAX_TEXT_LENGTH

__all__ = ["GSM8KEnv", "GSM8K_ENV_VAR", "GSM8K_HUB_ID", "load_gsm8k", "make_gsm8k_vector_env"]

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


class GSM8KEnv(DatasetChatEnv):
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
    - ``shuffle``, ``seed``, ``repeats``, ``group_repeats``, ``input_mode``, ``system_prompt``,
      ``tokenizer``, ``template_kwargs``, ``max_turns``, ``observation_keys``,
      ``max_text_length``, ``render_mode``: as ``DatasetChatEnv``.

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

    SYSTEM_PROMPT = (
        "A conversation between User and Assistant. The user asks a question, and the "
        "Assistant solves it.\nThe assistant first thinks about the reasoning process in the "
        "mind and then provides the user with the answer.\nThe reasoning process and answer "
        "are enclosed within <think></think> and <answer></answer> tags, respectively,\ni.e., "
        "<think>reasoning process here</think> <answer>answer here</answer>. The answer "
        "should be a number."
    )

    def __init__(
        self,
        *,
        split: str = "train",
        data_dir: str | os.PathLike[str] | None = None,
        dataset: Any = None,
        reward: GSM8KReward | None = None,
        shuffle: bool = True,
        seed: int | None = None,
        repeats: int | None = 1,
        group_repeats: bool = False,
        input_mode: str = "history",
        system_prompt: str | None = None,
        tokenizer: Any = None,
        template_kwargs: Mapping[str, Any] | None = None,
        max_turns: int | None = 1,
        observation_keys: tuple[str, ...] | list[str] | None = None,
        max_text_length: int = MAX_TEXT_LENGTH,
        render_mode: str | None = None,
    ) -> None:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if reward is None:
            reward = GSM8KReward()
        if not isinstance(reward, GSM8KReward):
            raise TypeError(f"reward must be a GSM8KReward, got {type(reward).__name__}")
        if dataset is not None and data_dir is not None:
            raise ValueError("pass either dataset= or data_dir=, not both")
        self.split, self.reward = split, reward
        if dataset is None:
            dataset = load_gsm8k(split, data_dir)
        elif isinstance(dataset, datasets.DatasetDict):
            dataset = dataset[split]
        super().__init__(
            dataset,
            split=split,
            shuffle=shuffle,
            seed=seed,
            repeats=repeats,
            group_repeats=group_repeats,
            field_map={"question": "query"},
            input_mode=input_mode,
            system_prompt=system_prompt,
            tokenizer=tokenizer,
            template_kwargs=template_kwargs,
            max_turns=max_turns,
            observation_keys=observation_keys,
            max_text_length=max_text_length,
            render_mode=render_mode,
        )

    def _score(self, response: str) -> tuple[float, bool, dict[str, Any]]:
        answer = self._sample["answer"]
        score = self.reward(response, answer)
        info = {  # not score.as_dict(): dataclasses.asdict deep-copies, 4x slower
            "reward_answer": score.reward_answer,
            "reward_think": score.reward_think,
            "reward_right": score.reward_right,
            "reward": score.reward,
            "success": score.success,
            "answer": answer,
        }
        # A given answer ends a multi-turn episode; single-turn ones end in ChatEnv.step.
        return score.reward, score.reward_answer > 0, info


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
    return DatasetChatVectorEnv(GSM8KEnv(**kwargs), num_envs)
