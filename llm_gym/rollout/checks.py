"""Argument and batch checks for ``RolloutFromModel``: each error names the argument, what was
expected and what came, before any model is called."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from llm_gym.checks import check_bool, check_int, check_number
from llm_gym.samplers import is_scorer
from llm_gym.wrappers.controllers import KLController

__all__ = ["check_settings", "check_tensor", "read_batch"]

_LENGTH_KEYS = ("max_new_tokens", "max_tokens", "max_length", "min_length")


def check_settings(
    model: Any,
    ref_model: Any,
    reward_model: Any,
    kl_coef: float | None,
    max_new_tokens: int,
    score_clip: float,
    kl_scheduler: Any,
    num_steps: int | None,
    label_baseline: bool,
    generate_kwargs: Mapping[str, Any] | None,
) -> float:
    """The constructor's checks; returns the KL coefficient to start from."""
    if not (callable(model) and hasattr(model, "generate") and hasattr(model, "config")):
        raise TypeError(
            f"model must be a transformers causal LM (with .generate), got {type(model).__name__}"
        )
    if not callable(ref_model):
        raise TypeError(
            f"ref_model must be a causal LM or a log-prob policy, got {type(ref_model).__name__}"
        )
    if is_scorer(ref_model) and getattr(ref_model, "input_mode", None) != "tokens":
        raise ValueError(
            "a log-prob policy as ref_model must read token ids (input_mode='tokens'), got "
            f"input_mode={getattr(ref_model, 'input_mode', None)!r}"
        )
    if not callable(reward_model):
        raise TypeError(f"reward_model must be callable, got {type(reward_model).__name__}")
    check_int("max_new_tokens", max_new_tokens, 1)
    check_int("num_steps", num_steps, 1, optional=True)
    if not isinstance(score_clip, (int, float)) or not score_clip > 0:
        raise ValueError(f"score_clip must be a number > 0 (inf: no clip), got {score_clip!r}")
    if kl_coef is not None:
        check_number("kl_coef", kl_coef, 0)
    if kl_scheduler is not None and not isinstance(kl_scheduler, KLController):
        raise TypeError(
            "kl_scheduler must be a KL controller (llm_gym.wrappers.controllers), got "
            f"{type(kl_scheduler).__name__}"
        )
    if kl_scheduler is None:
        kl_coef = 0.1 if kl_coef is None else kl_coef
    elif kl_coef is None:
        kl_coef = kl_scheduler.coef  # TorchRL's controllers set the model's coef at start
    elif not math.isclose(kl_coef, kl_scheduler.coef):
        raise ValueError(
            f"kl_coef={kl_coef} differs from kl_scheduler.coef={kl_scheduler.coef}: the "
            "scheduler recovers the KL by dividing by its own coef, so leave kl_coef unset"
        )
    check_bool("label_baseline", label_baseline)
    for key in _LENGTH_KEYS:
        if key in (generate_kwargs or {}):
            raise ValueError(
                f"generate_kwargs may not set {key!r}: the length is max_new_tokens "
                f"({max_new_tokens}), the episode length of every row"
            )
    return float(kl_coef)


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
    if rindex.shape != (batch_size,) or rindex.is_floating_point():
        raise ValueError(
            f"batch['prompt_rindex'] must be ({batch_size},) integers (one prompt length per "
            f"row), got dtype {rindex.dtype} and shape {tuple(rindex.shape)}"
        )
    if bool((rindex < 1).any() | (rindex > length).any()):
        raise ValueError(
            f"batch['prompt_rindex'] must be in [1, {length}] (the width of input_ids), got "
            f"{rindex.tolist()}"
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
