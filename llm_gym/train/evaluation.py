"""Greedy success on held-out questions: what ``llm-gym train`` reports before and after."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from llm_gym.policies import TransformersPolicy
from llm_gym.train.episodes import play_episodes
from llm_gym.train.setup import make_task_envs

__all__ = ["evaluate"]


@torch.no_grad()
def evaluate(
    model: Any,
    tokenizer: Any,
    env_id: str,
    *,
    episodes: int,
    seed: int,
    max_new_tokens: int,
    num_envs: int = 32,
    env_args: dict[str, Any] | None = None,
    **options: Any,
) -> dict[str, float]:
    """Greedy-decode ``episodes`` episodes of ``env_id`` from ``seed``'s questions; their
    mean ``success``, ``reward`` and response length in tokens (with ``tools=`` in
    ``options``: multi-turn episodes, and their tool calls).

    The sub-envs split one stream (``shard``), so the episodes are the stream's first
    ``episodes`` questions whatever ``num_envs`` is: the same before and after training.
    ``options`` go to the env as ``make_task_envs`` passes them.
    """
    num_envs = min(num_envs, episodes)
    envs = make_task_envs(env_id, num_envs, tokenizer, env_args, **options)
    policy = TransformersPolicy(
        model,
        tokenizer,
        input_mode="tokens",
        generate_kwargs={"max_new_tokens": max_new_tokens, "do_sample": False},
    )
    if options.get("tools"):
        try:
            return _evaluate_tool_episodes(envs, policy, episodes, seed)
        finally:
            envs.close()
    success, rewards, lengths = [], [], []
    obs, _ = envs.reset(seed=seed)
    try:
        while len(success) < episodes:
            responses = policy(obs)
            obs, reward, terminated, truncated, info = envs.step(responses)
            done = terminated | truncated
            if not done.all():
                raise ValueError(f"evaluate needs a single-turn task; {env_id} went on")
            final = info["final_info"]
            take = min(num_envs, episodes - len(success))
            success += [bool(s) for s in final["success"][:take]]
            rewards += reward[:take].tolist()
            lengths += [len(r.tokens) for r in responses[:take]]
    finally:
        envs.close()
    return {
        "success": float(np.mean(success)),
        "reward": float(np.mean(rewards)),
        "response_tokens": float(np.mean(lengths)),
    }


def _evaluate_tool_episodes(envs: Any, policy: Any, episodes: int, seed: int) -> dict[str, float]:
    # Multi-turn: rounds of one whole episode per sub-env, round r from the order of seed + r,
    # so the questions do not depend on how many turns the model took.
    success, rewards, lengths, calls = [], [], [], []
    round_ = 0
    while len(success) < episodes:
        obs, _ = envs.reset(seed=seed + round_)
        batch, _ = play_episodes(envs, policy, obs)
        take = min(envs.num_envs, episodes - len(success))
        success += [bool(info.get("success")) for info in batch.infos[:take]]
        rewards += batch.returns[:take].tolist()
        lengths += [int(mask.sum()) for mask in batch.masks[:take]]
        calls += [info.get("num_tool_calls", 0) for info in batch.infos[:take]]
        round_ += 1
    return {
        "success": float(np.mean(success)),
        "reward": float(np.mean(rewards)),
        "response_tokens": float(np.mean(lengths)),
        "tool_calls_per_episode": float(np.mean(calls)),
    }
