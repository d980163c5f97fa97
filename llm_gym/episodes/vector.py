"""The synchronous player: episodes of a vector env with SAME_STEP autoreset, every sub-env
stepped together with one batched generation a step (``Episodes``), one whole episode per
sub-env (``play_episodes``), and the vector env with its policy as an ``EpisodeSource``
(``VectorEpisodes``, what a GRPO iteration trains on). Across processes whose policy is one
sharded model, every process generates as often as the one with the longest episodes
(``Peers``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import gymnasium as gym
import numpy as np
import torch

from llm_gym.checks import check_int
from llm_gym.envs import single_env
from llm_gym.episodes.episode import Episode
from llm_gym.episodes.records import EpisodeTrace
from llm_gym.policies.base import Policy

__all__ = ["Episodes", "Peers", "VectorEpisodes", "multi_turn", "play_episodes", "still_playing"]


class Peers(Protocol):
    """The other processes of a run whose policy is one model sharded over them (FSDP2): each
    generation gathers every process's slice of the weights, so every process must generate
    as many times as the others, whatever its own episodes' turns."""

    def counts(self, count: int) -> list[int]:
        """Every process's ``count``, in process order (each process calls it)."""
        ...

    def sit_out(self) -> None:
        """A generation this process has no prompt for, paired with the others' (its
        policy's forwards step with theirs until each has finished)."""
        ...


def still_playing(active: int, peers: Peers | None) -> bool:
    """Whether a turn is to be played: this process has ``active`` prompts, or (``peers``)
    another process has some, which this one then sits out (``Peers.sit_out``).

    >>> still_playing(2, None), still_playing(0, None)
    (True, False)
    """
    if peers is None:
        return active > 0
    if not any(peers.counts(active)):
        return False
    if not active:
        peers.sit_out()
    return True


class Episodes:
    """The running episode of every sub-env of a vector env with SAME_STEP autoreset (the
    synchronous driver), and the ``Episode`` of each one that ends."""

    def __init__(self, envs: gym.vector.VectorEnv, obs: Mapping[str, Any]) -> None:
        self.envs, self.obs = envs, obs
        self.traces = [EpisodeTrace(history) for history in obs["history"]]

    def step(self, actions: list[Any]) -> list[Episode]:
        """Step every sub-env with its action (a ``Response``, or ``""``, which ends a sub-env's
        episode); the episodes that ended (``obs`` moves on)."""
        obs, rewards, terminated, truncated, info = self.envs.step(actions)
        for i, action in enumerate(actions):
            self.traces[i].add(action, rewards[i], info["kl"][i] if "kl" in info else None)
        self.obs, ended = obs, []
        for i in np.flatnonzero(terminated | truncated).tolist():
            final_info = {key: _column(value, i) for key, value in info["final_info"].items()}
            if "level" in info:  # the curriculum's level this episode was played at
                final_info["level"] = info["level"][i]
            ended.append(self.traces[i].finish(i, final_info, info["final_obs"][i]))
            self.traces[i] = EpisodeTrace(obs["history"][i])
        return ended


def multi_turn(envs: gym.vector.VectorEnv) -> bool:
    """Whether an episode of ``envs`` (a task's vector env) may take more than one response: with
    tools, in a game, with ``max_turns`` above 1 (as ``single_env`` says)."""
    template = single_env(envs)
    return template.max_turns != 1 or template.toolbox is not None


@torch.no_grad()
def play_episodes(
    envs: gym.vector.VectorEnv,
    policy: Policy,
    obs: dict[str, Any],
    before_turn: Callable[[Episodes, list[int]], None] | None = None,
    peers: Peers | None = None,
) -> tuple[list[Episode], float, dict[str, Any]]:
    """Play one episode in every sub-env of ``envs`` (a task's vector env) from ``obs``: the
    ``Episode`` of each (in sub-env order), the seconds spent generating and the last
    observation. Unless the task is ``multi_turn`` every response must end its episode.
    ``before_turn(running, active)``: called before each step with the running episodes and
    the sub-envs about to take a turn (``llm_gym.episodes.tree`` forks them there).
    ``peers``: the run's other processes, each playing its own sub-envs, in lock step."""
    single_turn = not multi_turn(envs)
    running = Episodes(envs, obs)
    records: list[Episode | None] = [None] * envs.num_envs
    seconds, turns = 0.0, 0
    while still_playing(records.count(None), peers):
        active = [i for i, record in enumerate(records) if record is None]
        if not active:  # sat out: another process's episodes go on
            continue
        if turns and single_turn:
            raise ValueError(
                "the task went on after a response: in a single-turn task leave max_turns "
                "at 1 (every response ends its episode)"
            )
        if before_turn is not None:
            before_turn(running, active)
        start = time.perf_counter()
        # "env_index": which sub-env each prompt is (a trainer draws each one's own stream).
        obs_batch = {"tokens": tuple(running.obs["tokens"][i] for i in active), "env_index": active}
        responses = policy(obs_batch)
        seconds += time.perf_counter() - start
        turns += 1
        # "" ends at once the throwaway episode a finished sub-env's autoreset began (multi-turn
        # callers reseed; single-turn episodes all end together, so obs continues the stream).
        actions: list[Any] = [""] * envs.num_envs
        for i, response in zip(active, responses, strict=True):
            actions[i] = response
        for episode in running.step(actions):
            if episode.env_index in active:  # not the throwaway episode of a finished one
                records[episode.env_index] = episode
    return records, seconds, running.obs


class VectorEpisodes:
    """A vector env and its policy as an ``EpisodeSource``: each ``episodes`` call plays one
    episode in every sub-env (``play_episodes``) from where the last one left the stream.

    Args:
        envs: a task's vector env (SAME_STEP autoreset).
        policy: ``policy(obs_batch) -> list[Response]`` on the ``"tokens"`` key.
        seed: the stream's seed, for the first call's reset (unless ``obs`` is given).
        obs: the observation to start from (an env reset and positioned already).
        reseed: multi-turn tasks: call ``k`` resets with seed ``reseed + k`` first (each
            group restarts on one item); ``first``: the first call's ``k`` (a resumed run's).
        peers: across processes of one sharded model, the others (``play_episodes``).

    Attributes:
        seconds: the seconds the last call spent generating.
    """

    def __init__(
        self,
        envs: gym.vector.VectorEnv,
        policy: Policy,
        *,
        seed: int | None = None,
        obs: dict[str, Any] | None = None,
        reseed: int | None = None,
        first: int = 0,
        peers: Peers | None = None,
    ) -> None:
        self.envs, self.policy, self.seed, self.obs = envs, policy, seed, obs
        self.reseed, self.calls = reseed, check_int("first", first, 0)
        self.peers = peers
        self.seconds = 0.0

    def episodes(self, count: int) -> list[Episode]:
        """One episode of every sub-env: ``count`` must be ``envs.num_envs``."""
        if count != self.envs.num_envs:
            raise ValueError(
                f"count must be the vector env's num_envs={self.envs.num_envs} (an episode of "
                f"every sub-env), got {count}"
            )
        if self.reseed is not None:  # a fresh seed restarts each group on one item
            self.obs, _ = self.envs.reset(seed=self.reseed + self.calls)
        elif self.obs is None:
            self.obs, _ = self.envs.reset(seed=self.seed)
        self.calls += 1
        played, self.seconds, self.obs = play_episodes(
            self.envs, self.policy, self.obs, peers=self.peers
        )
        return played

    def close(self) -> None:
        """Close the vector env."""
        self.envs.close()


def _column(value: Any, i: int) -> Any:
    # Env i's entry of a vector info value (a task's metadata dict nests).
    if isinstance(value, Mapping):
        return {key: _column(item, i) for key, item in value.items() if not key.startswith("_")}
    return value[i]
