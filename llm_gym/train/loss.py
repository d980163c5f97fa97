"""GRPO's clipped surrogate losses (Shao et al., 2024), as TRL 1.16's ``GRPOTrainer``
computes them: its loss types, GSPO's sequence-level ratio, clip-higher, two-sided clipping,
the k3 KL term and the truncated importance weights of a sampler that is not the trainer (a
differential test against TRL holds them equal); the tokens they read, the micro-batches they
run in and the adaptive entropy bonus. The advantages they weigh come from
``llm_gym.train.advantages``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from llm_gym.checks import check_choice
from llm_gym.episodes import ran_out
from llm_gym.train.config import IMPORTANCE_SAMPLING_LEVELS, LOSS_TYPES

if TYPE_CHECKING:
    from llm_gym.episodes import Episode, Segment

__all__ = [
    "EntropyBonus",
    "grpo_loss",
    "log_importance_weights",
    "microbatch_tokens",
    "microbatches",
    "at_policy_tokens",
    "trained_segments",
    "truncated_is_weights",
    "update_stats",
]


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


def at_policy_tokens(mask: torch.Tensor, log_probs: Sequence[Any]) -> torch.Tensor:
    """``(B, T)`` old log-probs for ``grpo_loss``: row ``b`` of ``log_probs`` (the log-probs
    its policy tokens were sampled with) at the True positions of ``mask[b]``, in order.

    >>> at_policy_tokens(torch.tensor([[False, True, True]]), [[-0.5, -1.0]]).tolist()
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
