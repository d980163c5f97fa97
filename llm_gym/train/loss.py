"""GRPO's advantages and clipped surrogate loss (Shao et al., 2024), as TRL computes them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["group_advantages", "grpo_loss", "microbatches", "sampled"]


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-4) -> torch.Tensor:
    """GRPO's advantages: each reward standardized within its group of ``group_size``
    consecutive entries (a group whose rewards are all equal gets 0).

    >>> group_advantages(torch.tensor([1.0, 0.0, 0.5, 0.5]), 2).tolist()
    [0.9998000264167786, -0.9998000264167786, 0.0, 0.0]
    """
    groups = rewards.reshape(-1, group_size)
    mean, std = groups.mean(1, keepdim=True), groups.std(1, keepdim=True, unbiased=False)
    return ((groups - mean) / (std + eps)).reshape(-1)


def grpo_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    clip_coef: float,
) -> torch.Tensor:
    """GRPO's clipped surrogate, negated: per token, averaged over each response's tokens,
    then over responses. ``log_probs``/``old_log_probs``/``mask`` are ``(B, T)``,
    ``advantages`` ``(B,)``.

    >>> lp = torch.zeros(1, 2)
    >>> grpo_loss(lp, lp, torch.ones(1, 2, dtype=torch.bool), torch.tensor([2.0]), 0.2).item()
    -2.0
    """
    ratio = torch.exp(log_probs - old_log_probs)
    adv = advantages[:, None]
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - clip_coef, 1 + clip_coef) * adv)
    mask = mask.to(surrogate.dtype)
    per_response = (surrogate * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    return -per_response.mean()


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


def microbatches(lengths: Sequence[int], max_tokens: int, max_rows: int) -> list[list[int]]:
    """The indices of sequences of ``lengths``, shortest first, in micro-batches of at most
    ``max_rows`` sequences whose padded size (rows × the longest) is at most ``max_tokens``
    (a longer sequence goes alone): an update's memory is then bounded by the token budget,
    not by the batch. Sorting by length keeps the padding small; the loss is the same for
    any split (each response weighs 1/n).

    >>> microbatches([700, 20, 30, 650, 25], max_tokens=1400, max_rows=8)
    [[1, 4, 2], [3, 0]]
    >>> microbatches([5, 5, 5], max_tokens=100, max_rows=2)
    [[0, 1], [2]]
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:  # ascending: the newest sequence is the longest of its batch
        if current and (len(current) == max_rows or (len(current) + 1) * lengths[i] > max_tokens):
            batches.append(current)
            current = []
        current.append(i)
    return batches + [current] if current else batches
