"""GRPO's advantages and clipped surrogate losses (Shao et al., 2024), as TRL 1.16's
``GRPOTrainer`` computes them: its five loss types, GSPO's sequence-level ratio, clip-higher,
two-sided clipping, the k3 KL term and the truncated importance weights of a sampler that is
not the trainer (a differential test against TRL holds them equal)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from llm_gym.checks import check_choice
from llm_gym.episodes import ran_out
from llm_gym.train.config import (
    ADVANTAGE_ESTIMATORS,
    IMPORTANCE_SAMPLING_LEVELS,
    LOSS_TYPES,
    SCALE_REWARDS,
    TURN_ESTIMATORS,
)

if TYPE_CHECKING:
    from llm_gym.episodes import Episode, Segment

__all__ = [
    "EntropyBonus",
    "advantages",
    "discounted_returns",
    "overlong_penalty",
    "overlong_tokens",
    "shaped_rewards",
    "shaped_turn_rewards",
    "token_advantages",
    "trained_segments",
    "turn_advantages",
    "group_advantages",
    "grpo_loss",
    "log_importance_weights",
    "microbatch_tokens",
    "microbatches",
    "sampled",
    "truncated_is_weights",
    "update_stats",
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


def discounted_returns(rewards: Sequence[float], gamma: float = 1.0) -> list[float]:
    """Each turn's return from the ``rewards`` of an episode's turns:
    ``G_t = r_t + gamma * G_{t+1}``, the last turn's its reward.

    >>> [round(g, 4) for g in discounted_returns([0.0, 0.5, 1.0], 0.9)]
    [1.26, 1.4, 1.0]
    >>> discounted_returns([0.25, 0.5, 0.25])
    [1.0, 0.75, 0.25]
    """
    returns, later = [0.0] * len(rewards), 0.0
    for t in reversed(range(len(rewards))):
        later = returns[t] = float(rewards[t]) + gamma * later
    return returns


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


def trained_segments(
    episodes: Sequence[Episode],
    max_new_tokens: int | None = None,
    eos_token_id: int | None = None,
) -> tuple[list[Segment], list[np.ndarray], list[int]]:
    """Every episode's segments, the mask the loss reads of each, and its episode's index.
    Given ``max_new_tokens`` (``--mask-truncated``), an episode whose last response the budget
    cut (``ran_out``) keeps its segments with masks of False: out of the loss and its token
    count, as TRL's ``mask_truncated_completions``."""
    segments, masks, index = [], [], []
    for i, episode in enumerate(episodes):
        cut = max_new_tokens is not None and ran_out(episode, max_new_tokens, eos_token_id)
        for segment in episode.segments:
            mask = np.asarray(segment.policy_mask, dtype=bool)
            segments.append(segment)
            masks.append(np.zeros_like(mask) if cut else mask)
            index.append(i)
    return segments, masks, index


def log_importance_weights(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    mask: torch.Tensor,
    level: str = "token",
) -> torch.Tensor:
    """log π/π_old: per token ``(B, T)``, or per response ``(B, 1)`` as the mean of its tokens'
    (``level="sequence"``, GSPO's length-normalized sequence ratio).

    >>> lp, old = torch.tensor([[-1.0, -2.0, 0.0]]), torch.tensor([[-1.5, -1.0, 0.0]])
    >>> log_importance_weights(lp, old, torch.tensor([[True, True, False]]), "sequence")
    tensor([[-0.2500]])
    """
    check_choice("importance_sampling_level", level, IMPORTANCE_SAMPLING_LEVELS)
    log_ratio = log_probs - old_log_probs
    if level == "token":
        return log_ratio
    mask = mask.to(log_ratio.dtype)
    return ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0))[:, None]


def grpo_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    clip_coef: float,
    *,
    loss_type: str = "grpo",
    clip_coef_high: float | None = None,
    delta: float | None = None,
    importance_sampling_level: str = "token",
    ref_log_probs: torch.Tensor | None = None,
    beta: float = 0.0,
    num_tokens: int | float | torch.Tensor | None = None,
    max_length: int | None = None,
    is_weights: torch.Tensor | None = None,
    kl_bias_correction: bool = True,
) -> torch.Tensor:
    """GRPO's clipped surrogate, negated, over the response tokens of ``mask``, as TRL's
    ``_compute_loss``. ``log_probs``/``old_log_probs``/``mask``/``ref_log_probs`` are
    ``(B, T)``, ``advantages`` ``(B,)``.

    - ``loss_type``: how the per-token losses are aggregated (``LOSS_TYPES``, in
      ``llm_gym.train.config``, names each); ``num_tokens``
      (dapo, cispo: the whole batch's response tokens, so that a micro-batch's loss sums to
      the batch's; default this one's) and ``max_length`` (dr_grpo's constant) go with it.
    - ``clip_coef_high``: clip-higher's upper ε (default ``clip_coef``); for cispo the cap on
      the ratio itself (TRL's ``epsilon_high``, 5.0 in MiniMax's recipe). ``delta`` caps the
      unclipped ratio too (two-sided clipping).
    - ``importance_sampling_level``: ``"sequence"`` is GSPO's ratio.
    - ``beta`` · k3 KL to ``ref_log_probs`` is added per token, times the ratio
      (``kl_bias_correction``, TRL's ``use_bias_correction_kl``: the unbiased gradient of the
      reverse KL, DeepSeek-V3.2); ``is_weights`` (``(B, T)``, e.g. ``truncated_is_weights``)
      multiply the policy term first, as TRL's vLLM correction.

    >>> lp = torch.zeros(1, 2)
    >>> grpo_loss(lp, lp, torch.ones(1, 2, dtype=torch.bool), torch.tensor([2.0]), 0.2).item()
    -2.0
    >>> grpo_loss(lp, lp, torch.tensor([[True, False]]), torch.tensor([2.0]), 0.2,
    ...           loss_type="dr_grpo", max_length=4).item()
    -0.5
    """
    check_choice("loss_type", loss_type, LOSS_TYPES)
    if loss_type == "dr_grpo" and max_length is None:
        raise ValueError("loss_type 'dr_grpo' needs max_length (the longest response allowed)")
    if beta != 0.0 and ref_log_probs is None:
        raise ValueError(f"beta={beta} needs ref_log_probs (the reference's log-probs)")
    adv = advantages[:, None] if advantages.dim() == 1 else advantages
    coef_1 = torch.exp(
        log_importance_weights(log_probs, old_log_probs, mask, importance_sampling_level)
    )
    kl = None
    if beta != 0.0:
        kl = _k3(ref_log_probs, log_probs) * (coef_1 if kl_bias_correction else 1.0)
    high = clip_coef if clip_coef_high is None else clip_coef_high
    if loss_type == "cispo":  # the ratio only weighs the log-prob; no gradient through it
        per_token = -torch.clamp(coef_1, max=high).detach() * adv * log_probs
    elif loss_type == "sapo":  # a sigmoid gate of the ratio in place of the hard clip
        tau = torch.where(adv > 0, SAPO_TEMPERATURES[0], SAPO_TEMPERATURES[1])
        per_token = -torch.sigmoid(tau * (coef_1 - 1)) * 4 / tau * adv
    elif loss_type == "vespo":  # a Gamma weight of the response's ratio, no gradient through it
        phi = _gamma_weights(adv, log_probs - old_log_probs, mask, is_weights)
        per_token, is_weights = -phi * adv * log_probs, None  # the weights are in phi
    else:
        coef_2 = torch.clamp(coef_1, 1 - clip_coef, 1 + high)
        if delta is not None:
            coef_1 = torch.clamp(coef_1, max=delta)
        per_token = -torch.min(coef_1 * adv, coef_2 * adv)
    if is_weights is not None:
        per_token = per_token * is_weights
    if kl is not None:
        per_token = per_token + beta * kl
    mask = mask.to(per_token.dtype)
    if loss_type in ("grpo", "sapo"):
        return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "luspo":  # each response's loss summed over its tokens: its length counts
        return (per_token * mask).sum(-1).mean()
    if loss_type == "bnpo":
        return (per_token * mask).sum() / mask.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":
        return (per_token * mask).sum() / (mask.shape[0] * max_length)
    tokens = mask.sum() if num_tokens is None else torch.as_tensor(num_tokens)
    return (per_token * mask).sum() / tokens.to(per_token).clamp(min=1.0)


# TRL 1.16's defaults: SAPO's gate temperatures for positive and other advantages, and VESPO's
# Gamma shape (k) and rate (λ) for non-negative and negative ones.
SAPO_TEMPERATURES = (1.0, 1.05)
VESPO_GAMMA = {"k_pos": 2.0, "lambda_pos": 3.0, "k_neg": 3.0, "lambda_neg": 2.0}


@torch.no_grad()
def _gamma_weights(
    adv: torch.Tensor, log_ratio: torch.Tensor, mask: torch.Tensor, is_weights: torch.Tensor | None
) -> torch.Tensor:
    # VESPO's φ(w) = e^λ w^k e^(-λ w) of each response's ratio w = Π π/π_old (times the
    # sampler's correction), normalised so that φ(1) = 1, computed in log space and clamped as
    # TRL's get_gamma_weights; (B, 1), a weight without gradient.
    low = math.log(1e-8)
    log_w = (torch.clamp(log_ratio, -20.0, 20.0) * mask).sum(-1, keepdim=True)
    if is_weights is not None:
        log_w = log_w + torch.clamp(torch.log(is_weights), low, 20.0).sum(-1, keepdim=True)
    log_w = torch.clamp(log_w, low, 20.0)
    up = adv >= 0
    k = torch.where(up, VESPO_GAMMA["k_pos"], VESPO_GAMMA["k_neg"])
    lam = torch.where(up, VESPO_GAMMA["lambda_pos"], VESPO_GAMMA["lambda_neg"]).clamp(min=1e-4)
    log_phi = lam + k * log_w - lam * torch.exp(log_w)
    return torch.exp(log_phi).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def _k3(target_log_probs: torch.Tensor, log_probs: torch.Tensor) -> torch.Tensor:
    # Schulman's k3 estimator of KL(π ‖ target) from samples of π: exp(d) - d - 1 with
    # d = log target - log π; non-negative, and unbiased.
    d = target_log_probs - log_probs
    return torch.exp(d) - d - 1


def truncated_is_weights(
    old_log_probs: torch.Tensor, sampled_log_probs: torch.Tensor, mask: torch.Tensor, cap: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Truncated importance sampling for samples drawn by another engine (vLLM, a server):
    per token ``min(exp(trainer_old − sampled), cap)`` (1 off ``mask``, and where a sampled
    log-prob is NaN), as TRL's ``token_truncate``; and the ``(B, T)`` mask of the tokens whose
    ratio the cap cut.

    >>> w, cut = truncated_is_weights(torch.tensor([[0.0, 0.0]]), torch.tensor([[-0.1, -5.0]]),
    ...                               torch.tensor([[True, True]]), 2.0)
    >>> [round(x, 4) for x in w[0].tolist()], cut.tolist()
    ([1.1052, 2.0], [[False, True]])
    """
    diff = torch.nan_to_num((old_log_probs - sampled_log_probs) * mask.to(old_log_probs.dtype))
    ratio = torch.exp(diff)
    return ratio.clamp(max=cap), (ratio > cap) & mask.bool()


def update_stats(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    clip_coef: float,
    *,
    loss_type: str = "grpo",
    clip_coef_high: float | None = None,
    delta: float | None = None,
    importance_sampling_level: str = "token",
    ref_log_probs: torch.Tensor | None = None,
) -> dict[str, float]:
    """What the update did to the ``mask``'s tokens, as sums over them (divide by
    ``"tokens"``, after adding up a batch's micro-batches): ``clip_low``/``clip_high`` count
    the tokens whose ratio was clipped below (negative advantage) or above (positive), as
    TRL's ``clip_ratio/*`` (cispo: above its cap only; with ``delta``, of the ratio it
    capped, as TRL); ``approx_kl`` sums the k3 estimate of KL(π_old ‖ π), CleanRL's
    ``approx_kl``. A sequence-level ratio counts at each of its tokens (TRL: once). Given
    ``ref_log_probs``, ``reference_kl`` sums the k3 estimate of KL(π ‖ reference), TRL's
    ``kl`` metric (which TRL weighs by the ratio, 1 in a step's first epoch).

    >>> update_stats(torch.tensor([[0.5, 0.0]]), torch.zeros(1, 2), torch.ones(1, 2).bool(),
    ...              torch.tensor([1.0]), 0.2)["clip_high"]
    1.0
    """
    with torch.no_grad():
        adv = advantages[:, None] if advantages.dim() == 1 else advantages
        log_w = log_importance_weights(log_probs, old_log_probs, mask, importance_sampling_level)
        coef, mask = torch.exp(log_w), mask.bool()
        if delta is not None and loss_type != "cispo":
            coef = torch.clamp(coef, max=delta)
        high = clip_coef if clip_coef_high is None else clip_coef_high
        if loss_type == "cispo":
            low, above = torch.zeros_like(coef, dtype=torch.bool), (coef > high) & (adv > 0)
        else:
            low, above = (coef < 1 - clip_coef) & (adv < 0), (coef > 1 + high) & (adv > 0)
        low, above = low.expand_as(mask) & mask, above.expand_as(mask) & mask
        kl = _k3(log_probs, old_log_probs)[mask]  # old → new, from old's samples
        stats = {
            "tokens": float(mask.sum()),
            "clip_low": float(low.sum()),
            "clip_high": float(above.sum()),
            "approx_kl": float(kl.sum()),
        }
        if ref_log_probs is not None:
            stats["reference_kl"] = float(_k3(ref_log_probs, log_probs)[mask].sum())
        return stats


def sampled(mask: torch.Tensor, log_probs: Sequence[Any]) -> torch.Tensor:
    """``(B, T)`` old log-probs for ``grpo_loss``: row ``b`` of ``log_probs`` (the log-probs
    its policy tokens were sampled with) at the True positions of ``mask[b]``, in order.

    >>> sampled(torch.tensor([[False, True, True]]), [[-0.5, -1.0]]).tolist()
    [[0.0, -0.5, -1.0]]
    """
    counts = mask.sum(1).tolist()
    for b, (row, count) in enumerate(zip(log_probs, counts, strict=True)):
        if row is None or len(row) != count:
            got = "none" if row is None else len(row)
            raise ValueError(
                f"response {b} has {count} policy tokens but {got} sampled log-probs: the "
                "sampler must return one log-prob per sampled token"
            )
    old = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    rows = [torch.as_tensor(row, dtype=torch.float32) for row in log_probs]
    old[mask] = torch.cat(rows).to(mask.device)
    return old


def microbatch_tokens(lengths: Sequence[int], packed: bool = False) -> int:
    """The tokens a forward over sequences of ``lengths`` computes: rows × the longest when
    they are padded, their sum when ``packed`` into one row (``llm_gym.lm.packing``).

    >>> microbatch_tokens([700, 20]), microbatch_tokens([700, 20], packed=True)
    (1400, 720)
    """
    return sum(lengths) if packed else len(lengths) * max(lengths, default=0)


def microbatches(
    lengths: Sequence[int], max_tokens: int, max_rows: int, packed: bool = False
) -> list[list[int]]:
    """The indices of sequences of ``lengths``, shortest first, in micro-batches of at most
    ``max_rows`` sequences whose size (``microbatch_tokens``: padded, or ``packed``) is at
    most ``max_tokens`` (a longer sequence goes alone): an update's memory is then bounded by
    the token budget, not by the batch. Sorting by length keeps the padding small; the loss
    is the same for any split (each response weighs 1/n).

    >>> microbatches([700, 20, 30, 650, 25], max_tokens=1400, max_rows=8)
    [[1, 4, 2], [3, 0]]
    >>> microbatches([700, 20, 30, 650, 25], max_tokens=1400, max_rows=8, packed=True)
    [[1, 4, 2, 3], [0]]
    >>> microbatches([5, 5, 5], max_tokens=100, max_rows=2)
    [[0, 1], [2]]
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:  # ascending: the newest sequence is the longest of its batch
        grown = [lengths[j] for j in current] + [lengths[i]]
        if current and (len(current) == max_rows or microbatch_tokens(grown, packed) > max_tokens):
            batches.append(current)
            current = []
        current.append(i)
    return batches + [current] if current else batches


class EntropyBonus:
    """TRL 1.16's entropy bonus: the loss less ``coef`` times the batch's mean per-token
    entropy H (the same meaning whatever the loss type). With a ``target`` it is TRL's
    adaptive control (``use_adaptive_entropy``, from Skywork-OR1): after each optimizer step
    the coefficient moves by ``delta`` within ``[low, high]``, up while that step's H is at or
    below the target and down above it, and a step applies it only while the previous step's
    H was at or below the target (none before the first is measured).

    >>> bonus = EntropyBonus(0.01, target=0.5, delta=0.01)
    >>> bonus.applied(), bonus.step(0.3), bonus.applied(), bonus.step(0.9), bonus.applied()
    (0.0, None, 0.02, None, 0.0)
    >>> bonus.state_dict()
    {'coef': 0.01, 'last_entropy': 0.9}
    """

    def __init__(
        self,
        coef: float = 0.0,
        target: float | None = None,
        delta: float = 0.005,
        low: float = 0.0,
        high: float = 1.0,
    ) -> None:
        self.coef, self.target, self.delta, self.low, self.high = coef, target, delta, low, high
        self.last_entropy = math.inf

    @property
    def on(self) -> bool:
        """Whether the loss carries the bonus (an adaptive one even at a coefficient of 0)."""
        return self.coef != 0.0 or self.target is not None

    def applied(self) -> float:
        """The coefficient this step's loss applies."""
        if self.target is None or self.last_entropy <= self.target:
            return self.coef
        return 0.0

    def step(self, entropy: float) -> None:
        """After an optimizer step whose mean per-token entropy was ``entropy``."""
        if self.target is None:
            return
        if entropy <= self.target:
            self.coef = min(self.coef + self.delta, self.high)
        else:
            self.coef = max(self.coef - self.delta, self.low)
        self.last_entropy = entropy

    def state_dict(self) -> dict[str, float]:
        """The coefficient and the last step's entropy, what a resumed run goes on from."""
        return {"coef": self.coef, "last_entropy": self.last_entropy}

    def load_state_dict(self, state: dict[str, float]) -> None:
        """Go on from ``state_dict()``'s values."""
        self.coef, self.last_entropy = float(state["coef"]), float(state["last_entropy"])
