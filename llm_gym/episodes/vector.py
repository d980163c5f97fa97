"""The synchronous player: episodes of a vector env with SAME_STEP autoreset, every sub-env
stepped together with one batched generation a step (``Episodes``), and one whole episode per
sub-env (``play_episodes``, what a GRPO iteration trains on)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from llm_gym.envs import single_env
from llm_gym.episodes.records import EpisodeTrace
from llm_gym.policies.base import Policy

__all__ = ["Episodes", "multi_turn", "play_episodes"]


class Episodes:
    """The running episode of every sub-env of a vector env with SAME_STEP autoreset (the
    synchronous driver), and the record of each one that ends."""

    def __init__(self, envs: gym.vector.VectorEnv, obs: Mapping[str, Any]) -> None:
        self.envs, self.obs = envs, obs
        self.traces = [EpisodeTrace(history) for history in obs["history"]]

    def step(self, actions: list[Any]) -> list[dict[str, Any]]:
        """Step every sub-env with its action (a ``Response``, or ``""``, which ends a sub-env's
        episode); the records of the episodes that ended (``obs`` moves on)."""
        obs, rewards, terminated, truncated, info = self.envs.step(actions)
        for i, action in enumerate(actions):
            self.traces[i].add(action, rewards[i], info["kl"][i] if "kl" in info else None)
        self.obs, records = obs, []
        for i in np.flatnonzero(terminated | truncated).tolist():
            final_info = {key: _column(value, i) for key, value in info["final_info"].items()}
            if "level" in info:  # the curriculum's level this episode was played at
                final_info["level"] = info["level"][i]
            records.append(self.traces[i].finish(i, final_info, info["final_obs"][i]))
            self.traces[i] = EpisodeTrace(obs["history"][i])
        return records


def multi_turn(envs: gym.vector.VectorEnv) -> bool:
    """Whether an episode of ``envs`` (a task's vector env) may take more than one response: with
    tools, in a game, with ``max_turns`` above 1 (as ``single_env`` says)."""
    template = single_env(envs)
    return template.max_turns != 1 or template.toolbox is not None


@torch.no_grad()
def play_episodes(
    envs: gym.vector.VectorEnv, policy: Policy, obs: dict[str, Any]
) -> tuple[list[dict[str, Any]], float, dict[str, Any]]:
    """Play one episode in every sub-env of ``envs`` (a task's vector env) from ``obs``: their
    records (``Episodes``), the seconds spent generating and the last
    observation. Unless the task is ``multi_turn`` every response must end its episode."""
    single_turn = not multi_turn(envs)
    running = Episodes(envs, obs)
    records: list[Any] = [None] * envs.num_envs
    seconds, turns = 0.0, 0
    while None in records:
        if turns and single_turn:
            raise ValueError(
                "the task went on after a response: in a single-turn task leave max_turns "
                "at 1 (every response ends its episode)"
            )
        active = [i for i, record in enumerate(records) if record is None]
        start = time.perf_counter()
        responses = policy({"tokens": tuple(running.obs["tokens"][i] for i in active)})
        seconds += time.perf_counter() - start
        turns += 1
        # "" ends at once the throwaway episode a finished sub-env's autoreset began (multi-turn
        # callers reseed; single-turn episodes all end together, so obs continues the stream).
        actions: list[Any] = [""] * envs.num_envs
        for i, response in zip(active, responses, strict=True):
            actions[i] = response
        for record in running.step(actions):
            if record["env_index"] in active:  # not the throwaway episode of a finished one
                records[record["env_index"]] = record
    return records, seconds, running.obs


def _column(value: Any, i: int) -> Any:
    # Env i's entry of a vector info value (a task's metadata dict nests).
    if isinstance(value, Mapping):
        return {key: _column(item, i) for key, item in value.items() if not key.startswith("_")}
    return value[i]
