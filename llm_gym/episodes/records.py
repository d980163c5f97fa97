"""How an env episode becomes an ``Episode``: the same way in the synchronous vector env's
``Episodes`` and in ``AsyncEpisodes`` (one ``EpisodeTrace`` per running episode)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from llm_gym.episodes.episode import Episode, Segment

if TYPE_CHECKING:
    from llm_gym.chat.containers import Response

__all__ = ["KL_INFO_KEYS", "EpisodeTrace", "json_value"]

# What the KL wrappers add to a step's info: kept as the record's token_kl, kl_mean, kl_sum.
KL_INFO_KEYS = ("kl", "kl_penalty", "token_rewards", "ref_log_probs", "log_probs")


def json_value(value: object) -> Any:
    """A JSON-ready Python value for one env's info entry: dicts (without their ``_`` keys),
    lists and tuples nested, numpy arrays and scalars as Python's, dataclasses as dicts, and
    anything else JSON cannot hold as its ``str``.

    >>> json_value({"a": np.arange(2), "_mask": 1, "b": (np.float32(0.5), None)})
    {'a': [0, 1], 'b': [0.5, None]}
    """
    if isinstance(value, Mapping):
        return {
            str(key): json_value(item)
            for key, item in value.items()
            if not str(key).startswith("_")
        }
    if isinstance(value, (list, tuple)):
        return [json_value(item) for item in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return json_value(dataclasses.asdict(value))
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    return str(value)


class EpisodeTrace:
    """One sub-env's running episode: the prompt it started from, then each step's action,
    reward and KL; ``finish`` turns it into its ``Episode``.

    >>> trace = EpisodeTrace([{"role": "user", "content": "2+2?"}])
    >>> trace.add("4", 1.0)
    >>> final = {"history": [], "tokens": [1, 2], "policy_mask": [False, True]}
    >>> episode = trace.finish(0, {"reward": 1.0, "success": True}, final)
    >>> episode.response, episode.reward, episode.reward_task, episode.info
    ('4', 1.0, 1.0, {'success': True})
    >>> episode.turn_rewards, episode.turn_tokens  # a str action: no tokens sampled
    ([1.0], [0])
    >>> episode.segments[0].policy_mask.tolist()
    [False, True]
    """

    def __init__(self, prompt: Iterable[Mapping[str, Any]]) -> None:
        self.prompt = list(prompt)
        self.responses: list[str] = []
        self.versions: list[int | None] = []
        self.log_probs: list[np.ndarray | None] = []
        self.kl: list[np.ndarray] = []
        self.reward, self.tokens = 0.0, 0
        self.rewards: list[float] = []  # each step's
        self.turn_tokens: list[int] = []  # each step's sampled tokens

    def copy(self) -> EpisodeTrace:
        """The episode so far, apart from this one (a fork's trace from here on)."""
        other = object.__new__(EpisodeTrace)
        other.__dict__.update({key: list(value) if isinstance(value, list) else value
                               for key, value in self.__dict__.items()})  # fmt: skip
        return other

    def add(self, action: Response | str, reward: float, kl: np.ndarray | None = None) -> None:
        """Count one step: its action (a ``Response`` or text), reward and per-token KL."""
        self.responses.append(getattr(action, "text", action))
        self.versions.append(getattr(action, "version", None))
        self.log_probs.append(getattr(action, "log_probs", None))
        tokens = getattr(action, "tokens", None)
        self.turn_tokens.append(0 if tokens is None else len(tokens))
        self.tokens += self.turn_tokens[-1]
        self.rewards.append(float(reward))
        self.reward += float(reward)
        if kl is not None:
            self.kl.append(np.asarray(kl))

    def finish(
        self, env_index: int, info: Mapping[str, Any], final_obs: Mapping[str, Any]
    ) -> Episode:
        """The ended episode, from the last step's ``info`` and observation."""
        parts = json_value(info)
        kl = np.concatenate(self.kl) if self.kl else None
        # The task's own "reward" is kept as reward_task; "reward" is the episode's return,
        # KL penalty included.
        reward_task = parts.pop("reward", None)
        level = parts.pop("level", None)
        if "num_tool_calls" in parts:  # the whole conversation, tool messages included
            parts["conversation"] = list(final_obs["history"])
        sampled = None
        if self.log_probs and all(lp is not None for lp in self.log_probs):
            sampled = np.concatenate(self.log_probs).astype(np.float32)
        # No segment where the env's observations hold no tokens (history or text only).
        ids, mask = _array(final_obs, "tokens", np.int64), _array(final_obs, "policy_mask", bool)
        segments = [] if ids is None or mask is None else [Segment(ids, mask, sampled)]
        return Episode(
            prompt=self.prompt,
            responses=self.responses,
            reward=self.reward,
            reward_task=reward_task,
            info={key: value for key, value in parts.items() if key not in KL_INFO_KEYS},
            segments=segments,
            versions=self.versions,  # the policy version of each assistant turn
            num_tokens=self.tokens,
            sampled_log_probs=sampled,
            token_kl=kl,
            kl_mean=None if kl is None or not len(kl) else float(kl.mean()),
            kl_sum=None if kl is None else float(kl.sum()),
            env_index=env_index,
            level=level,
            turn_rewards=list(self.rewards),
            turn_tokens=list(self.turn_tokens),
        )


def _array(obs: Mapping[str, Any], key: str, dtype: Any) -> np.ndarray | None:
    return np.asarray(obs[key]).astype(dtype) if key in obs else None
