"""The greedy evaluation before and after training: held-out episodes of the run's task."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
import torch

from llm_gym.episodes import Episode, multi_turn, play_episodes, summarize
from llm_gym.policies import TransformersPolicy
from llm_gym.run.config import RunConfig
from llm_gym.run.setup import task_envs
from llm_gym.train.config import GRPOConfig
from llm_gym.train.play import LockStep, agent_episodes
from llm_gym.train.sharding import gather_objects, is_sharded, process_rank, world_size

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from llm_gym.policies.base import Policy

__all__ = ["evaluate_agent", "evaluate_greedy"]


@torch.no_grad()
def evaluate_greedy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    config: RunConfig,
    *,
    episodes: int,
    seed: int,
    num_envs: int = 32,
    policy: Policy | None = None,
    compute_dtype: torch.dtype | None = None,
) -> dict[str, float]:
    """Greedy-decode ``episodes`` episodes of ``config``'s task (no curriculum) from ``seed``'s
    questions, the same ones whatever ``num_envs`` and the model's turns; their mean
    ``success``, ``reward``, ``response_tokens`` (and with tools ``tool_calls_per_episode``).
    ``policy`` replaces the greedy ``TransformersPolicy`` of ``model`` (computing in
    ``compute_dtype``: ``TransformersPolicy``'s)."""
    tools = bool(config.tools)
    # Across processes, each plays its part of the sub-envs (world | num_envs) and the
    # episodes are gathered in the order one process plays them.
    world, rank = world_size(), process_rank()
    num_envs = -(-min(num_envs, episodes) // world) * world
    shards = (rank * num_envs // world, num_envs) if world > 1 else None
    envs = task_envs(replace(config, curriculum=0), tokenizer, num_envs // world, shards=shards)
    turns = multi_turn(envs)
    own = policy is None  # the sharded model's own greedy policy, which sits turns out
    if policy is None:  # not make_policy: GRPOConfig refuses temperature 0
        kwargs = {"max_new_tokens": config.max_new_tokens, "do_sample": False}
        policy = TransformersPolicy(
            model, tokenizer, input_mode="tokens", generate_kwargs=kwargs,
            compute_dtype=compute_dtype,
        )  # fmt: skip
    records: list[Episode] = []
    # Each process's games, generating as often as the others' (one model sharded over them).
    peers = LockStep(policy, own and is_sharded(model)) if world > 1 and turns else None
    try:
        obs, _ = envs.reset(seed=seed)
        while len(records) < episodes:
            if turns and records:  # round r of multi-turn episodes from seed + r
                obs, _ = envs.reset(seed=seed + len(records) // num_envs)
            played, _, obs = play_episodes(envs, policy, obs, peers=peers)
            records += gather_objects(played)[: episodes - len(records)]
    finally:
        envs.close()
    summary = summarize(records, seconds=0.0)
    lengths = [episode.policy_tokens for episode in records]
    result = {
        "success": summary.accuracy,
        "reward": summary.mean_reward,
        "response_tokens": float(np.mean(lengths)),
    }
    return result | ({"tool_calls_per_episode": summary.tool_calls_per_episode} if tools else {})


def evaluate_agent(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, config: GRPOConfig
) -> dict[str, float]:
    """The agent's runs over ``config.eval_episodes`` held-out items of ``eval_seed``, its
    calls greedy unless it asks otherwise: their mean ``success``, ``reward``,
    ``response_tokens`` and how many runs failed (``agent_errors``)."""
    kwargs = {"max_new_tokens": config.max_new_tokens, "do_sample": False}
    greedy = TransformersPolicy(model, tokenizer, input_mode="tokens", generate_kwargs=kwargs)
    with agent_episodes(config, tokenizer, greedy, 1, config.eval_seed) as agents:
        episodes = agents.episodes(config.eval_episodes, seed=config.eval_seed)
    return {
        "success": float(np.mean([e.success for e in episodes])),
        "reward": float(np.mean([e.reward for e in episodes])),
        "response_tokens": float(np.mean([e.num_tokens for e in episodes])),
        "agent_errors": sum(e.error is not None for e in episodes),
    }
