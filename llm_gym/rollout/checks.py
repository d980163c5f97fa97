"""The batch and tensor checks of ``RolloutFromModel``: each error names the argument, what
was expected and what came, before any model is called."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["check_tensor", "read_batch"]


def read_batch(
    batch: Any, device: torch.device, label_baseline: bool
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """``input_ids``, ``attention_mask`` and ``prompt_rindex`` of a batch, checked."""
    fields = {}
    for key in ("input_ids", "attention_mask", "prompt_rindex"):
        value = batch.get(key) if isinstance(batch, Mapping) else getattr(batch, key, None)
        fields[key] = None if value is None else torch.as_tensor(value, device=device)
    input_ids, attention_mask, rindex = fields.values()
    if input_ids is None or rindex is None:
        raise KeyError(
            "batch must hold 'input_ids' (B, L) and 'prompt_rindex' (B,), got "
            f"{sorted(batch) if isinstance(batch, Mapping) else type(batch).__name__}"
        )
    if input_ids.ndim != 2 or input_ids.numel() == 0 or input_ids.is_floating_point():
        raise ValueError(
            "batch['input_ids'] must be a non-empty (B, L) integer tensor, got dtype "
            f"{input_ids.dtype} and shape {tuple(input_ids.shape)}"
        )
    batch_size, length = input_ids.shape
    out_of_range = bool(((rindex < 1) | (rindex > length)).any())
    if rindex.shape != (batch_size,) or rindex.is_floating_point() or out_of_range:
        raise ValueError(
            f"batch['prompt_rindex'] must be ({batch_size},) integers in [1, {length}] (one "
            f"prompt length per row, at most input_ids' width), got {rindex.tolist()} "
            f"({rindex.dtype})"
        )
    if attention_mask is not None and attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"batch['attention_mask'] must have input_ids' shape {tuple(input_ids.shape)}, "
            f"got {tuple(attention_mask.shape)}"
        )
    if attention_mask is None and label_baseline:
        raise KeyError(
            "batch has no 'attention_mask', needed to score its reference completion "
            "(label_baseline=True); pass label_baseline=False for prompt-only batches"
        )
    return input_ids.long(), attention_mask, rindex.long()


def check_tensor(
    max_new_tokens: int, name: str, value: Any, shape: tuple[int, ...]
) -> torch.Tensor:
    """``value`` if it is a tensor of ``shape`` (the batch's, for ``max_new_tokens``)."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.shape != shape:
        raise ValueError(
            f"{name} must have shape {shape} for this batch and max_new_tokens="
            f"{max_new_tokens}, got {tuple(value.shape)}"
        )
    return value
