"""Greedy success on held-out questions: what ``llm-gym train`` reports before and after."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from llm_gym.policies import TransformersPolicy
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
    """Greedy-decode ``episodes`` single-turn episodes of ``env_id`` from ``seed``'s
    questions; their mean ``success``, ``reward`` and response length in tokens.

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
