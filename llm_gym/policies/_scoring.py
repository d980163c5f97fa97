"""Per-token log-probs and the position masks of ``get_dist``, over left-padded batches.

Padding is read from the attention mask only, never from token ids: with ``pad_token ==
eos_token`` a real EOS looks exactly like padding.
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from llm_gym.policies._inputs import Encoded

__all__ = [
    "DIST_MASKS",
    "dist_mask",
    "gather_log_probs",
    "has_prefix",
    "keeps_logits",
    "takes_response_only",
    "token_log_probs",
]

# get_dist mask names; the second of each pair is TorchRL's name for the use case.
DIST_MASKS = {"prompt": "prompt", "sft": "prompt", "assistant": "assistant", "rlhf": "assistant"}
DIST_MASKS |= {"attention": "attention", "generic": "attention"}


# About 24 MB of float32 logits per chunk: log_softmax's temporary then stays in cache, which
# measured 2x faster on CPU than one logsumexp over the whole (B, T, V) batch (whose composite
# kernel writes several batch-sized temporaries), and peak memory stays flat.
_CHUNK_ELEMENTS = 6 * 2**20


def keeps_logits(model: Any) -> bool:
    """Whether a causal LM's forward takes ``logits_to_keep`` (most transformers models do)."""
    return "logits_to_keep" in _parameters(getattr(model, "forward", model))


def takes_response_only(scorer: Any) -> bool:
    """Whether a scorer's call takes ``response_only=`` (TransformersPolicy, RayLogProbModel);
    scorers written to the older protocol do not, and are called without it."""
    return "response_only" in _parameters(scorer)


def _parameters(function: Any) -> Any:
    try:
        return inspect.signature(function).parameters
    except (TypeError, ValueError):  # builtins and some C callables have no signature
        return {}


def gather_log_probs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``log_softmax(logits)[i, targets[i]]`` for ``(N, V)`` logits, in float32, chunked."""
    rows = max(1, _CHUNK_ELEMENTS // logits.shape[-1])
    out = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
    for start in range(0, logits.shape[0], rows):
        chunk = logits[start : start + rows].float()
        picked = torch.log_softmax(chunk, dim=-1).gather(-1, targets[start : start + rows, None])
        out[start : start + rows] = picked.squeeze(-1)
    return out


def token_log_probs(
    logits: torch.Tensor, ids: torch.Tensor, attention: torch.Tensor
) -> torch.Tensor:
    """``(B, T)`` log π(ids[t] | ids[:t]); 0 at padding and at each sequence's first token."""
    scored = has_prefix(attention)
    log_probs = torch.zeros(ids.shape, dtype=torch.float32, device=logits.device)
    # Row by row over the span of scored tokens only: the log-softmax over the vocabulary is
    # most of the cost, and padding (a fifth of a GSM8K batch) need not pay it. Position t's
    # logits predict token t + 1, so the span's logits are a view shifted by one, not a copy.
    width = ids.shape[1]
    spans = torch.stack(
        [scored.any(1), scored.int().argmax(1), width - scored.flip(1).int().argmax(1)], dim=1
    ).tolist()  # (any scored, first, end) per row, in one device sync
    for row, (any_scored, first, end) in enumerate(spans):
        if any_scored:
            span = gather_log_probs(logits[row, first - 1 : end - 1], ids[row, first:end])
            log_probs[row, first:end] = span
    return log_probs.masked_fill(~scored, 0.0)


def has_prefix(attention: torch.Tensor) -> torch.Tensor:
    """Real tokens that have at least one real token before them (padding is by mask only)."""
    before = F.pad(attention[:, :-1], (1, 0), value=False)
    return attention & before


def dist_mask(mask: Any, encoded: list[Encoded], attention: torch.Tensor) -> torch.Tensor:
    batch, width = attention.shape
    if isinstance(mask, str):
        if mask not in DIST_MASKS:
            raise ValueError(
                f"mask must be one of {sorted(DIST_MASKS)} or a bool array, got {mask!r}"
            )
        kind = DIST_MASKS[mask]
        if kind == "attention":
            return attention
        rows = []
        for i, enc in enumerate(encoded):
            if kind == "assistant":
                if enc.assistant_mask is None:
                    raise ValueError(
                        f"mask='assistant' needs to know the assistant's tokens, unknown for "
                        f"conversation {i}: give history input or the responses"
                    )
                rows.append(enc.assistant_mask)
            else:
                if enc.prompt_length is None:
                    raise ValueError(
                        f"mask='prompt' needs to know where the response starts, unknown for "
                        f"conversation {i}: pass the prompt as obs and the responses separately"
                    )
                rows.append(np.arange(len(enc.ids)) >= enc.prompt_length)
        mask = rows
    if isinstance(mask, (list, tuple)):
        if len(mask) != batch:
            raise ValueError(
                f"mask must have one entry per conversation ({batch}), got {len(mask)}"
            )
        padded = np.zeros((batch, width), dtype=bool)
        for i, (row, enc) in enumerate(zip(mask, encoded, strict=True)):
            row = np.asarray(row)
            if row.shape != enc.ids.shape or row.dtype != bool:
                raise ValueError(
                    f"mask[{i}] must be a bool array of the conversation's length "
                    f"{len(enc.ids)}, got dtype {row.dtype} and shape {row.shape}"
                )
            padded[i, width - len(row) :] = row
        mask = padded
    mask = torch.as_tensor(mask, device=attention.device)
    if mask.dtype != torch.bool or mask.shape != (batch, width):
        raise ValueError(
            f"a custom mask must be bool with the padded shape {(batch, width)}, got dtype "
            f"{mask.dtype} and shape {tuple(mask.shape)}"
        )
    return mask & attention
