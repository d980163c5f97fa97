"""Whole episodes across a vector env, one per sub-env (what a GRPO iteration trains on), and
the greedy evaluation before and after training."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from llm_gym.policies import TransformersPolicy
from llm_gym.run.config import RunConfig
from llm_gym.run.rollout import Episodes, summarize
from llm_gym.run.setup import task_envs, template_env

__all__ = ["evaluate", "multi_turn", "play_episodes"]


def multi_turn(envs: Any) -> bool:
    """Whether an episode of ``envs`` (``task_envs``) may take more than one response: with
    tools, in a game, with ``max_turns`` above 1 (as ``template_env`` says)."""
    template = template_env(envs)
    return template.max_turns != 1 or template.toolbox is not None


@torch.no_grad()
def play_episodes(
    envs: Any, policy: Any, obs: dict[str, Any]
) -> tuple[list[dict[str, Any]], float, dict[str, Any]]:
    """Play one episode in every sub-env of ``envs`` (``task_envs``) from ``obs``: their
    records (``llm_gym.run.rollout.Episodes``), the seconds spent generating and the last
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


@torch.no_grad()
def evaluate(
    model: Any,
    tokenizer: Any,
    config: RunConfig,
    *,
    episodes: int,
    seed: int,
    num_envs: int = 32,
    policy: Any = None,
) -> dict[str, float]:
    """Greedy-decode ``episodes`` episodes of ``config``'s task (no curriculum) from ``seed``'s
    questions, the same ones whatever ``num_envs`` and the model's turns; their mean
    ``success``, ``reward``, ``response_tokens`` (and with tools ``tool_calls_per_episode``).
    ``policy`` replaces the greedy ``TransformersPolicy`` of ``model``."""
    tools = bool(config.tools)
    envs = task_envs(replace(config, curriculum=0), tokenizer, min(num_envs, episodes))
    turns = multi_turn(envs)
    if policy is None:  # not make_sampler: GRPOConfig refuses temperature 0
        kwargs = {"max_new_tokens": config.max_new_tokens, "do_sample": False}
        policy = TransformersPolicy(model, tokenizer, input_mode="tokens", generate_kwargs=kwargs)
    records: list[dict[str, Any]] = []
    try:
        obs, _ = envs.reset(seed=seed)
        while len(records) < episodes:
            if turns and records:  # round r of multi-turn episodes from seed + r
                obs, _ = envs.reset(seed=seed + len(records) // envs.num_envs)
            played, _, obs = play_episodes(envs, policy, obs)
            records += played[: episodes - len(records)]
    finally:
        envs.close()
    summary = summarize(records, seconds=0.0)
    lengths = [record["policy_mask"].sum() for record in records]
    result = {
        "success": summary.accuracy,
        "reward": summary.mean_reward,
        "response_tokens": float(np.mean(lengths)),
    }
    return result | ({"tool_calls_per_episode": summary.tool_calls_per_episode} if tools else {})
