"""Greedy success on held-out questions: what ``llm-gym train`` reports before and after."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from llm_gym.policies import TransformersPolicy
from llm_gym.run.setup import make_task_envs
from llm_gym.train.episodes import play_episodes

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
    policy: Any = None,
    **options: Any,
) -> dict[str, float]:
    """Greedy-decode ``episodes`` episodes of ``env_id`` from ``seed``'s questions; their
    mean ``success``, ``reward`` and response length in tokens (with ``tools=`` in
    ``options``: multi-turn episodes, and their tool calls per episode).

    Single-turn episodes are the first ``episodes`` questions of one stream that the sub-envs
    split (``shard``), whatever ``num_envs`` is: the same before and after training. Tool
    episodes are played in rounds of one whole episode per sub-env, round ``r`` from the
    order of ``seed + r``, so the questions do not depend on how many turns the model took.
    ``options`` go to the env as ``make_task_envs`` passes them; ``policy`` replaces the
    greedy ``TransformersPolicy`` of ``model``.
    """
    tools = bool(options.get("tools"))
    envs = make_task_envs(env_id, min(num_envs, episodes), tokenizer, env_args, **options)
    if policy is None:
        kwargs = {"max_new_tokens": max_new_tokens, "do_sample": False}
        policy = TransformersPolicy(model, tokenizer, input_mode="tokens", generate_kwargs=kwargs)
    success, rewards, lengths, calls = [], [], [], []
    try:
        obs, _ = envs.reset(seed=seed)
        while len(success) < episodes:
            if tools and success:
                obs, _ = envs.reset(seed=seed + len(success) // envs.num_envs)
            batch, obs = play_episodes(envs, policy, obs)
            if batch.turns > 1 and not tools:
                raise ValueError(f"evaluate needs a single-turn task; {env_id} went on")
            take = min(envs.num_envs, episodes - len(success))
            success += [bool(info.get("success")) for info in batch.infos[:take]]
            rewards += batch.returns[:take].tolist()
            lengths += [int(mask.sum()) for mask in batch.masks[:take]]
            calls += [info.get("num_tool_calls", 0) for info in batch.infos[:take]]
    finally:
        envs.close()
    result = {
        "success": float(np.mean(success)),
        "reward": float(np.mean(rewards)),
        "response_tokens": float(np.mean(lengths)),
    }
    return result | ({"tool_calls_per_episode": float(np.mean(calls))} if tools else {})
