"""Whole episodes across a vector env, one per sub-env (what a GRPO iteration trains on), and
``evaluate``, the greedy success on held-out questions before and after training.

Sub-envs whose episode has ended get the empty answer, which ends the throwaway episode their
autoreset began at once (multi-turn callers reseed before the next batch; single-turn
episodes all end in one step, so the returned observation continues the env's stream). An
episode's conversation is its last observation's ``tokens``, and ``policy_mask`` marks the
tokens the policy sampled: a trainer's loss never reads tool output.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from llm_gym.policies import TransformersPolicy
from llm_gym.run.setup import make_task_envs

__all__ = ["EpisodeBatch", "evaluate", "play_episodes"]

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
