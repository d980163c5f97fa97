"""Whole episodes across a vector env, one per sub-env: what a GRPO iteration trains on.

A single-turn episode takes one step; with tools an episode takes a varying number of turns.
Each sub-env plays exactly one episode from the observation given; the policy generates only
for sub-envs still playing, and a sub-env whose episode has ended gets the empty answer,
which ends the throwaway episode its autoreset began at once (a multi-turn caller resets the
vector env with a seed before the next batch, so the throwaway questions cost nothing and
GRPO groups stay aligned; when every episode ends in one step there is none, and the
returned observation continues the env's stream).

An episode's conversation is its last observation's ``tokens`` (the final turn included) and
``policy_mask`` marks the tokens the policy sampled: a trainer scores the conversation in one
forward and takes its loss on those tokens only, never on tool output.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["EpisodeBatch", "play_episodes"]

_KEPT = ("success", "reward", "num_tool_calls", "failed_tool_calls")


@dataclass
class EpisodeBatch:
    """One finished episode per sub-env."""

    returns: np.ndarray  # (N,) summed rewards
    tokens: list[np.ndarray]  # each episode's whole conversation
    masks: list[np.ndarray]  # bool, True on the policy's tokens
    infos: list[dict[str, Any]]  # the final step's success, reward and tool counts
    kl: list[np.ndarray]  # the KL wrappers' per-token KL of every step (none without them)
    generated: int  # tokens the policy generated
    seconds: float  # spent generating
    turns: int  # policy calls: 1 when every episode ended in one step


@torch.no_grad()
def play_episodes(envs: Any, policy: Any, obs: dict[str, Any]) -> tuple[EpisodeBatch, dict]:
    """Play one episode in every sub-env of ``envs`` (a tokens-mode vector env with
    ``policy_mask``, SAME_STEP autoreset) from ``obs``; the episodes and the last obs."""
    n = envs.num_envs
    done = np.zeros(n, dtype=np.bool_)
    returns = np.zeros(n, dtype=np.float64)
    tokens: list[Any] = [None] * n
    masks: list[Any] = [None] * n
    infos: list[dict[str, Any]] = [{} for _ in range(n)]
    kl: list[np.ndarray] = []
    generated, seconds, turns = 0, 0.0, 0
    while not done.all():
        active = np.flatnonzero(~done).tolist()
        start = time.perf_counter()
        responses = policy({"tokens": tuple(obs["tokens"][i] for i in active)})
        seconds += time.perf_counter() - start
        turns += 1
        actions: list[Any] = [""] * n
        for i, response in zip(active, responses, strict=True):
            actions[i] = response
            generated += len(response.tokens)
        obs, rewards, terminated, truncated, info = envs.step(actions)
        for i in active:
            returns[i] += rewards[i]
            if "kl" in info:
                kl.append(np.asarray(info["kl"][i]))
            if terminated[i] or truncated[i]:
                final = info["final_obs"][i]
                tokens[i] = np.asarray(final["tokens"])
                masks[i] = np.asarray(final["policy_mask"]).astype(np.bool_)
                kept = info["final_info"]
                infos[i] = {key: kept[key][i].item() for key in _KEPT if key in kept}
                done[i] = True
    return EpisodeBatch(returns, tokens, masks, infos, kl, generated, seconds, turns), obs
