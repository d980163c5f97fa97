"""One ``Episode`` type, whoever played it: the vector env's player, ``AsyncEpisodes`` and an
agent program through the gateway (``llm_gym.agents.AgentEpisodes``) all answer
``episodes(count) -> list[Episode]`` (the ``EpisodeSource`` protocol), and a trainer reads
every one the same way: its ``segments`` (the token sequences it trains on), its ``reward``.

``record()`` gives the episode as the dict ``llm-gym rollout`` writes (one ``episodes.jsonl``
line, less the token arrays named in ``ARRAYS``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = ["ARRAYS", "Episode", "EpisodeSource", "Segment"]

# Record keys that JSON skips: the conversation's token ids and policy mask, the behaviour
# log-probs (one per policy token, from the version that sampled it) and the per-token KL.
ARRAYS = ("conversation_ids", "policy_mask", "sampled_log_probs", "token_kl")


@dataclass(frozen=True)
class Segment:
    """One training sequence of an episode: ``ids`` (token ids, shape ``(T,)``),
    ``policy_mask`` (``(T,)``, True on every token the policy sampled), ``log_probs`` (one per
    True of the mask, as sampled; None where the sampler gave none). An agent's segment also
    names its calls' ``versions`` and indices (``calls``); an env episode has one segment,
    its whole conversation.

    >>> s = Segment(np.array([5, 6, 7]), np.array([False, True, True]), None)
    >>> int(s.policy_mask.sum()), s.versions
    (2, ())
    """

    ids: np.ndarray
    policy_mask: np.ndarray
    log_probs: np.ndarray | None
    versions: tuple[int | None, ...] = ()
    calls: tuple[int, ...] = ()


@dataclass
class Episode:
    """A finished episode, as every source of episodes gives it.

    - ``prompt``: the chat messages it started from; ``responses``: each assistant turn's
      text; ``response``: the final answer ("" if it failed).
    - ``reward``: its return (a KL penalty included); ``reward_task``: the task's own reward;
      ``info``: the task's reward parts and info at the end (JSON-ready: ``success``,
      ``answer``, a rubric's parts, tool counts...).
    - ``turn_rewards``: an env episode's reward of each step (its turns', summing to
      ``reward``), and ``turn_tokens``: how many of its policy tokens each turn sampled, in
      order (None: an agent's, whose one reward comes at its end).
    - ``segments``: the token sequences to train on (env episodes: one, or none where the
      env's observations hold no tokens); ``versions``: the policy version of each turn.
    - ``num_tokens``: tokens sampled; per response token, ``sampled_log_probs`` (as the
      sampler gave them, or None; an env episode's segment holds the same) and ``token_kl``
      (or None); ``kl_mean`` and ``kl_sum``.
    - ``env_index``: the sub-env (or agent slot) that played it; ``item_index``: its item's
      position in the stream and ``seed`` the stream's (asynchronous and agent episodes);
      ``level``: the level its item was drawn at (a curriculum's).
    - A branched group's (``llm_gym.episodes.tree``): ``branch``, ``{"of": p, "turn": t}``
      for an episode forked from episode ``p`` of its batch before its turn ``t`` (its
      turns before are ``p``'s, which train them), None for a chain; ``turn_values``,
      VinePPO's Monte Carlo value of the state each turn was made in.
    - An agent's: ``item`` (the task item it played), ``error`` (None unless it failed),
      ``calls`` (the gateway's record of its model calls; None for env episodes) and
      ``seconds``.

    >>> e = Episode([{"role": "user", "content": "2+2?"}], ["4"], 1.0, 1.0, {"success": True},
    ...             [Segment(np.array([1, 2]), np.array([False, True]), None)], [0], 1)
    >>> e.success, e.policy_tokens, e.record()["policy_mask"].tolist()
    (True, 1, [False, True])
    """

    prompt: list[dict[str, Any]]
    responses: list[str]
    reward: float
    reward_task: float | None
    info: dict[str, Any]
    segments: list[Segment]
    versions: list[int | None]
    num_tokens: int
    response: str | None = None  # None: the last of responses
    sampled_log_probs: np.ndarray | None = None
    token_kl: np.ndarray | None = None
    kl_mean: float | None = None
    kl_sum: float | None = None
    env_index: int = 0
    item_index: int | None = None
    seed: int | None = None
    level: int | None = None
    item: dict[str, Any] | None = None
    error: str | None = None
    calls: list[Any] | None = None  # an agent's llm_gym.agents.Call records
    seconds: float | None = None
    turn_rewards: list[float] | None = None
    turn_tokens: list[int] | None = None
    branch: dict[str, int] | None = None
    turn_values: list[float] | None = None

    def __post_init__(self) -> None:
        if self.response is None:
            self.response = self.responses[-1] if self.responses else ""

    @property
    def success(self) -> bool:
        """Whether the task counted it a success (``info["success"]``)."""
        return bool(self.info.get("success", False))

    @property
    def policy_tokens(self) -> int:
        """The tokens a trainer learns from: the policy's, over every segment."""
        return int(sum(int(np.sum(s.policy_mask)) for s in self.segments))

    @property
    def num_calls(self) -> int:
        """An agent's model calls (0 for an env episode)."""
        return len(self.calls or ())

    @property
    def num_segments(self) -> int:
        """How many sequences it trains on."""
        return len(self.segments)

    def record(self) -> dict[str, Any]:
        """The episode's record: what ``llm-gym rollout`` writes (less ``ARRAYS``); an
        agent's token arrays are its last segment's."""
        agent = self.calls is not None
        last = self.segments[-1] if self.segments else None
        empty = agent and last is None  # an agent that made no call: empty arrays
        record: dict[str, Any] = {}
        if self.item_index is not None and not agent:  # with seed: which item it played
            record.update(item_index=self.item_index, seed=self.seed)
        record["env_index"] = self.env_index
        if agent:  # its run's place in the batch
            record["item_index"] = self.item_index
        record.update(
            prompt=self.prompt, response=self.response, responses=self.responses,
            versions=self.versions, reward=self.reward,
        )  # fmt: skip
        if self.turn_rewards is not None:
            record["turn_rewards"] = self.turn_rewards
        if self.branch is not None:
            record["branch"] = dict(self.branch)
        if self.turn_values is not None:
            record["turn_values"] = [None if v != v else v for v in self.turn_values]
        record.update(self.info)
        if self.level is not None:
            record["level"] = self.level
        record["reward_task"] = self.reward_task
        if agent:
            record.update(error=self.error, num_calls=self.num_calls)
            record["num_segments"] = self.num_segments
        record["num_tokens"] = self.num_tokens
        if agent:
            record["seconds"] = self.seconds
        record.update(
            kl_mean=self.kl_mean,
            kl_sum=self.kl_sum,
            conversation_ids=np.zeros(0, np.int64) if empty else last and last.ids,
            policy_mask=np.zeros(0, np.bool_) if empty else last and last.policy_mask,
            sampled_log_probs=(last and last.log_probs) if agent else self.sampled_log_probs,
            token_kl=self.token_kl,
        )
        if agent:
            record.update(segments=self.segments, calls=self.calls, item=self.item)
        return record


@runtime_checkable
class EpisodeSource(Protocol):
    """Anything that plays episodes: ``episodes(count)`` plays ``count`` more (a GRPO group's
    are consecutive) and ``close()`` stops what it started.

    A source may also say ``seconds`` (the sampling time of its last call, for tokens/s),
    ``snapshot`` (the shared curriculum level and KL coefficient its last batch left),
    ``lag`` (updates between the sampling policy and the one training) and ``publish(i)``
    (iteration ``i``'s update reached its sampler): ``llm-gym train`` reads each it has."""

    def episodes(self, count: int) -> list[Episode]:
        """``count`` more episodes."""
        ...

    def close(self) -> None:
        """Stop what the source started (threads, servers, envs)."""
        ...
