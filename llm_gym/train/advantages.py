"""Advantages: how much better each response, or each turn of an episode, did than its
baseline. GRPO's group baseline and its variants (RLOO, REINFORCE++, GEM's ReBN) as TRL 1.16
and the papers compute them, each turn's discounted return for multi-turn episodes, the spread
of a turn's value over its tokens, and the rewards they are taken from (DAPO's soft overlong
penalty added). The loss that reads them is ``llm_gym.train.loss``."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from llm_gym.checks import check_choice
from llm_gym.episodes.tree import discounted_returns, turn_nodes
from llm_gym.train.config import ADVANTAGE_ESTIMATORS, SCALE_REWARDS, TURN_ESTIMATORS

if TYPE_CHECKING:
    from llm_gym.episodes import Episode, Segment

__all__ = [
    "advantages",
    "discounted_returns",
    "group_advantages",
    "overlong_penalty",
    "overlong_tokens",
    "per_token_advantages",
    "segment_advantages",
    "shaped_rewards",
    "shaped_turn_rewards",
    "token_advantages",
    "tree_advantages",
    "turn_advantages",
    "vine_advantages",
]


def group_advantages(
    rewards: torch.Tensor, group_size: int, scale: str = "group", eps: float = 1e-4
) -> torch.Tensor:
    """GRPO's advantages: each reward minus its group's mean (groups of ``group_size``
    consecutive entries), divided by the group's standard deviation (``scale="group"``), the
    whole batch's (``"batch"``) or nothing (``"none"``, Dr. GRPO's); each standard deviation
    with Bessel's correction, plus ``eps``, as TRL's ``nanstd``.
    A group whose rewards are all equal gets 0.

    >>> r = torch.tensor([1.0, 0.0, 0.5, 0.5])
    >>> [round(a, 4) for a in group_advantages(r, 2).tolist()]
    [0.707, -0.707, 0.0, 0.0]
    >>> group_advantages(r, 2, scale="none").tolist()
    [0.5, -0.5, 0.0, 0.0]
    """
    check_choice("scale", scale, SCALE_REWARDS)
    groups = rewards.reshape(-1, group_size)
    centred = groups - groups.mean(1, keepdim=True)
    if scale == "none":
        return centred.reshape(-1)
    std = groups.std(1, keepdim=True) if scale == "group" else rewards.std()
    return (centred / (std + eps)).reshape(-1)


def advantages(
    rewards: torch.Tensor,
    group_size: int,
    estimator: str = "grpo",
    scale: str = "group",
    eps: float = 1e-4,
) -> torch.Tensor:
    """Each response's advantage from the ``rewards`` of groups of ``group_size`` consecutive
    responses to one item, by ``estimator`` (``ADVANTAGE_ESTIMATORS``):

    - ``"grpo"``: the reward minus its group's mean, over ``scale``'s standard deviation
      (``group_advantages``);
    - ``"rloo"``: the reward minus the mean of the group's other rewards (RLOO's
      leave-one-out baseline, Ahmadian et al., 2024), over ``scale``'s standard deviation;
    - ``"reinforce++"``: REINFORCE++'s baseline (Hu, 2025): the reward minus its group's
      mean, then whitened over the batch (its mean and standard deviation);
    - ``"rebn"``: GEM's ReBN (Liu et al., 2025): the rewards normalised over the whole batch,
      no group baseline (of one-turn episodes; per turn, ``turn_advantages``).

    >>> r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    >>> [round(a, 3) for a in advantages(r, 3, "rloo", scale="none").tolist()]
    [1.0, -0.5, -0.5, 0.0, 0.0, 0.0]
    >>> [round(a, 3) for a in advantages(r, 3, "rebn").tolist()]
    [0.645, -1.291, -1.291, 0.645, 0.645, 0.645]
    >>> [round(a, 3) for a in advantages(r, 3, "reinforce++").tolist()]
    [1.825, -0.913, -0.913, 0.0, 0.0, 0.0]
    """
    check_choice("estimator", estimator, ADVANTAGE_ESTIMATORS)
    if estimator == "grpo":
        return group_advantages(rewards, group_size, scale, eps)
    if estimator == "rebn":
        return (rewards - rewards.mean()) / (rewards.std() + eps)
    groups = rewards.reshape(-1, group_size)
    centred = groups - groups.mean(1, keepdim=True)
    if estimator == "reinforce++":
        flat = centred.reshape(-1)
        return (flat - flat.mean()) / (flat.std() + eps)
    check_choice("scale", scale, SCALE_REWARDS)
    # r_i minus the others' mean: group_size / (group_size - 1) times r_i minus the mean.
    loo = (centred * group_size / (group_size - 1)).reshape(-1)
    if scale == "none":
        return loo
    std = groups.std(1, keepdim=True) if scale == "group" else rewards.std()
    return (loo.reshape(-1, group_size) / (std + eps)).reshape(-1)


def turn_advantages(
    turn_rewards: Sequence[Sequence[float]],
    group_size: int,
    estimator: str = "rebn",
    gamma: float = 1.0,
    scale: str = "group",
    eps: float = 1e-4,
) -> list[torch.Tensor]:
    """Each turn's advantage, per episode (``(turns,)`` each), from the ``turn_rewards`` of
    episodes in groups of ``group_size`` consecutive ones, by ``estimator``
    (``TURN_ESTIMATORS``) on each turn's discounted return ``G_t`` (``discounted_returns``):

    - ``"rebn"``: GEM's ReBN (Liu et al., 2025): every turn's return normalised over all the
      batch's turns (its mean and standard deviation); with one turn an episode, ``advantages``'
      ``"rebn"`` exactly;
    - ``"turn-grpo"``: turn ``t``'s return minus the mean of turn ``t``'s returns in its group
      (the episodes that reached turn ``t``), over ``scale``'s standard deviation: turn
      ``t``'s in the group (``"group"``), every turn's in the batch (``"batch"``), or none; a
      turn that one episode of the group reached gets 0.

    GEM's ReBN takes each step as a sample of the batch, as here; its tokens then share the
    step's value (``token_advantages``).

    >>> rebn = turn_advantages([[0.0, 1.0], [1.0]], 2)
    >>> [[round(a, 3) for a in e.tolist()] for e in rebn]
    [[0.0, 0.0], [0.0]]
    >>> grpo = turn_advantages([[0.0, 1.0], [0.0, 0.0], [1.0]], 3, "turn-grpo", scale="none")
    >>> [[round(a, 3) for a in e.tolist()] for e in grpo]
    [[0.333, 0.5], [-0.667, -0.5], [0.333]]
    """
    check_choice("estimator", estimator, TURN_ESTIMATORS)
    check_choice("scale", scale, SCALE_REWARDS)
    returns = [
        torch.tensor(discounted_returns(r, gamma), dtype=torch.float32) for r in turn_rewards
    ]
    flat = torch.cat(returns)
    if estimator == "rebn":
        mean, std = flat.mean(), flat.std()
        return [(g - mean) / (std + eps) for g in returns]
    batch_std, out = flat.std(), []
    for start in range(0, len(returns), group_size):
        group = returns[start : start + group_size]
        # (episodes, turns): turn t's returns side by side; NaN where an episode had ended.
        table = torch.full((len(group), max(len(g) for g in group)), math.nan)
        for row, g in enumerate(group):
            table[row, : len(g)] = g
        reached = ~table.isnan()
        count = reached.sum(0)
        centred = table - table.nansum(0) / count
        if scale == "group":  # Bessel's correction; a turn one episode reached: 0
            squares = centred.nan_to_num().square().sum(0)
            std = torch.where(count > 1, squares / (count - 1).clamp(min=1), 0.0).sqrt()
            centred = centred / (std + eps)
        elif scale == "batch":
            centred = centred / (batch_std + eps)
        out += [centred[row, : len(g)] for row, g in enumerate(group)]
    return out


def tree_advantages(
    turn_rewards: Sequence[Sequence[float]],
    branches: Sequence[Mapping[str, int] | None],
    group_size: int,
    gamma: float = 1.0,
    scale: str = "group",
    eps: float = 1e-4,
) -> list[torch.Tensor]:
    """Tree-GRPO's advantages (Ji et al., 2025) of each turn, per episode (``(turns,)``
    each), in groups of ``group_size`` consecutive episodes whose ``branches`` say where each
    left its parent (``{"of": p, "turn": k}``, ``llm_gym.episodes.tree.turn_nodes``): a turn's
    value is the mean return ``G_t`` of the group's episodes that made it (it and the branches
    that left it later), its baseline the mean ``G_t`` of all that made a turn in the state it
    was made in, over ``scale``'s standard deviation (those returns', the batch's, none). A
    state where one turn was made (no sibling) falls back to the group's baseline, its
    ``t``-th turns' (``turn_advantages``' ``"turn-grpo"``). Turns an episode shares with its
    parent are the parent's to train: theirs here are 0.

    Without branches this is turn-grpo; the chains' first turns, made in the group's one
    start, are compared with every episode's, as GRPO's.

    >>> r = [[0.0, 1.0], [0.0, 0.0], [1.0], [0.0, 0.0]]
    >>> b = [None, None, None, {"of": 0, "turn": 1}]
    >>> [[round(a, 3) for a in e.tolist()] for e in tree_advantages(r, b, 4, scale="none")]
    [[0.0, 0.5], [-0.5, -0.333], [0.5], [0.0, -0.5]]
    """
    check_choice("scale", scale, SCALE_REWARDS)
    returns = [discounted_returns(r, gamma) for r in turn_rewards]
    batch_std = float(np.std(np.concatenate([np.asarray(g) for g in returns]), ddof=1))
    out: list[torch.Tensor] = []
    for start in range(0, len(returns), group_size):
        group, branched = returns[start : start + group_size], branches[start : start + group_size]
        nodes = turn_nodes([len(g) for g in group], branched, start)
        through: dict[int, list[float]] = {}  # a turn -> the returns of the episodes making it
        state: dict[int, int] = {}  # a turn -> the turn before it (-1: the start)
        by_turn: dict[int, list[float]] = {}  # t -> the group's t-th turns' returns
        for e, g in enumerate(group):
            for t, value in enumerate(g):
                through.setdefault(nodes[e][t], []).append(value)
                state[nodes[e][t]] = nodes[e][t - 1] if t else -1
                by_turn.setdefault(t, []).append(value)
        made: dict[int, list[int]] = {}  # a state -> the turns made in it
        for node, before in state.items():
            made.setdefault(before, []).append(node)
        for e, g in enumerate(group):
            first = int(branched[e]["turn"]) if branched[e] else 0  # its own turns from here
            values = []
            for t in range(len(g)):
                node = nodes[e][t]
                siblings = made[state[node]]
                ref = [v for n in siblings for v in through[n]] if len(siblings) > 1 else by_turn[t]
                centred = float(np.mean(through[node])) - float(np.mean(ref))
                if t < first or len(ref) < 2:
                    centred = 0.0
                elif scale == "group":
                    centred /= float(np.std(ref, ddof=1)) + eps
                elif scale == "batch":
                    centred /= batch_std + eps
                values.append(centred)
            out.append(torch.tensor(values, dtype=torch.float32))
    return out


def vine_advantages(
    turn_rewards: Sequence[Sequence[float]],
    turn_values: Sequence[Sequence[float]],
    group_size: int,
    gamma: float = 1.0,
    scale: str = "group",
    eps: float = 1e-4,
) -> list[torch.Tensor]:
    """VinePPO's advantages (Kazemnejad et al., 2025) of each turn, per episode:
    ``r_t + gamma V(s_{t+1}) - V(s_t)`` with ``V`` the Monte Carlo value of the state each
    turn was made in (``turn_values``, ``Episode.turn_values``; the state after the last turn
    is worth 0), over ``scale``'s standard deviation of the advantages (the group's, the
    batch's, none). A value that is NaN (a branch's turn that its parent trains) gives 0.

    >>> [a.tolist() for a in vine_advantages([[0.0, 1.0]], [[0.5, 0.75]], 1, scale="none")]
    [[0.25, 0.25]]
    """
    check_choice("scale", scale, SCALE_REWARDS)
    raw = []
    for rewards, values in zip(turn_rewards, turn_values, strict=True):
        after = np.append(np.asarray(values[1:], dtype=np.float64), 0.0)
        raw.append(np.asarray(rewards, np.float64) + gamma * after - np.asarray(values, np.float64))

    def spread(rows: list[np.ndarray]) -> float:
        finite = np.concatenate(rows)
        finite = finite[np.isfinite(finite)]
        return float(np.std(finite, ddof=1)) if len(finite) > 1 else 0.0

    batch_std = spread(raw)
    out = []
    for start in range(0, len(raw), group_size):
        group = raw[start : start + group_size]
        std = {"group": spread(group), "batch": batch_std}.get(scale)
        for a in group:
            a = a if std is None else a / (std + eps)
            out.append(torch.tensor(np.nan_to_num(a, nan=0.0), dtype=torch.float32))
    return out


def token_advantages(
    policy_mask: np.ndarray, turn_tokens: Sequence[int], values: torch.Tensor
) -> np.ndarray:
    """A segment's per-token advantages (``(T,)`` float32): each turn's value (``values``,
    ``(turns,)``) on its policy tokens (``turn_tokens`` of them, in turn order, over the
    ``policy_mask``'s True positions), 0 elsewhere.

    >>> token_advantages(np.array([0, 1, 1, 0, 1], bool), [2, 1], torch.tensor([0.5, -1.0]))
    array([ 0. ,  0.5,  0.5,  0. , -1. ], dtype=float32)
    """
    positions = np.flatnonzero(policy_mask)
    if len(positions) != sum(turn_tokens) or len(turn_tokens) != len(values):
        raise ValueError(
            f"an episode's {len(positions)} policy tokens are not its {len(turn_tokens)} "
            f"turns' sampled tokens ({sum(turn_tokens)}): each turn's tokens must stay in the "
            "conversation as sampled (token-in, token-out)"
        )
    out = np.zeros(len(policy_mask), dtype=np.float32)
    out[positions] = np.repeat(values.detach().cpu().numpy(), turn_tokens)
    return out


def per_token_advantages(values: torch.Tensor, lengths: Sequence[int]) -> list[np.ndarray]:
    """Each conversation's advantage (``values``, ``(n,)``) on every one of its tokens
    (``lengths[i]`` of them): the one type the update takes (``(T,)`` float32 a
    conversation), whatever the estimator; the loss reads the masked ones.

    >>> per_token_advantages(torch.tensor([0.5, -1.0]), [2, 3])
    [array([0.5, 0.5], dtype=float32), array([-1., -1., -1.], dtype=float32)]
    """
    if len(values) != len(lengths):
        raise ValueError(
            f"values has {len(values)} advantages for {len(lengths)} conversations (lengths)"
        )
    values = values.detach().to("cpu", torch.float32).numpy()
    pairs = zip(values, lengths, strict=True)
    return [np.full(length, value, dtype=np.float32) for value, length in pairs]


def segment_advantages(
    episodes: Sequence[Episode],
    segments: Sequence[Segment],
    index: Sequence[int],
    *,
    estimator: str,
    group_size: int,
    gamma: float,
    scale: str,
    max_length: int,
    overlong: int,
    mine: slice = slice(None),
) -> list[np.ndarray]:
    """Each trained segment's advantages, one a token (``(T,)`` float32): the ``estimator``
    taken over the whole run's batch of ``episodes`` (a batch's std is every process's), in
    groups of ``group_size``, from their shaped rewards (``gamma``, DAPO's ``overlong``
    penalty past ``max_length - overlong`` tokens), scaled by ``scale``. ``mine``: this
    process's episodes among them; ``index``: each of ``segments``' episode among those. A
    per-episode estimator's value lies on all of its segment's tokens, a per-turn one's on
    each turn's policy tokens (``token_advantages``)."""
    if estimator in TURN_ESTIMATORS:
        shaped = shaped_turn_rewards(episodes, max_length, overlong)
        if estimator == "tree-grpo":
            branches = [e.branch for e in episodes]
            turns = tree_advantages(shaped, branches, group_size, gamma, scale)[mine]
        elif estimator == "vine":
            values = [e.turn_values for e in episodes]
            turns = vine_advantages(shaped, values, group_size, gamma, scale)[mine]
        else:
            turns = turn_advantages(shaped, group_size, estimator, gamma, scale)[mine]
        own = list(episodes)[mine]
        return [
            token_advantages(segment.policy_mask, own[i].turn_tokens, turns[i])
            if own[i].turn_tokens is not None
            else np.full(len(segment.ids), float(turns[i][-1]), dtype=np.float32)
            for segment, i in zip(segments, index, strict=True)
        ]
    shaped = shaped_rewards(episodes, max_length, overlong, gamma)
    values = advantages(torch.tensor(shaped), group_size, estimator, scale)[mine]
    values = values[torch.tensor(list(index), dtype=torch.long)]
    return per_token_advantages(values, [len(segment.ids) for segment in segments])


def overlong_penalty(length: int, max_length: int, cache: int) -> float:
    """DAPO's soft overlong punishment (Yu et al., 2025, eq. 13; TRL's
    ``get_soft_overlong_punishment``): 0 up to ``max_length - cache`` tokens, then falling
    linearly to -1 at ``max_length``, and -1 beyond.

    >>> [overlong_penalty(n, 100, 20) for n in (80, 90, 100, 101)]
    [0.0, -0.5, -1.0, -1.0]
    """
    if length <= max_length - cache:
        return 0.0
    if length <= max_length:
        return ((max_length - cache) - length) / cache
    return -1.0


def overlong_tokens(given: int | None, max_length: int, single_turn: bool) -> int:
    """``--overlong-cache``'s tokens: ``given``, or (None) a sixth of the response budget
    ``max_length`` for single-turn episodes (8 of the main job's 48; DAPO's 4096 of 20480 is
    a fifth) and none for multi-turn and agent episodes, whose policy tokens add up over their
    turns and calls.

    >>> [overlong_tokens(None, 48, True), overlong_tokens(None, 48, False)]
    [8, 0]
    >>> overlong_tokens(8, 48, False), overlong_tokens(0, 48, True)
    (8, 0)
    """
    if given is not None:
        return given
    return max_length // 6 if single_turn else 0


def shaped_turn_rewards(
    episodes: Sequence[Episode], max_length: int, cache: int = 0
) -> list[list[float]]:
    """The rewards of each episode's turns that advantages are taken from: its
    ``turn_rewards`` (one turn, its ``reward``, where it has none: an agent's), with
    ``cache`` the soft overlong penalty of its policy tokens against ``max_length``
    (``overlong_penalty``) added to the last."""
    shaped = []
    for e in episodes:
        rewards = list(e.turn_rewards) if e.turn_rewards else [e.reward]
        if cache:
            rewards[-1] += overlong_penalty(e.policy_tokens, max_length, cache)
        shaped.append(rewards)
    return shaped


def shaped_rewards(
    episodes: Sequence[Episode], max_length: int, cache: int = 0, gamma: float = 1.0
) -> list[float]:
    """The returns advantages are taken from, one an episode: its reward, with ``cache`` the
    soft overlong penalty of its policy tokens against ``max_length`` (``overlong_penalty``);
    with ``gamma`` below 1 its turns' rewards discounted from the first
    (``discounted_returns``)."""
    if gamma < 1:
        shaped = shaped_turn_rewards(episodes, max_length, cache)
        return [discounted_returns(rewards, gamma)[0] for rewards in shaped]
    if not cache:
        return [e.reward for e in episodes]
    return [e.reward + overlong_penalty(e.policy_tokens, max_length, cache) for e in episodes]
