"""Per-token log-probs and the position masks of ``get_dist``, over left-padded batches.

Padding is read from the attention mask only, never from token ids: with ``pad_token ==
eos_token`` a real EOS looks exactly like padding.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from llm_gym.policies._inputs import Encoded

__all__ = ["DIST_MASKS", "dist_mask", "has_prefix", "token_log_probs"]

# get_dist mask names; the second of each pair is TorchRL's name for the use case.
DIST_MASKS = {"prompt": "prompt", "sft": "prompt", "assistant": "assistant", "rlhf": "assistant"}
DIST_MASKS |= {"attention": "attention", "generic": "attention"}


def token_log_probs(
    logits: torch.Tensor, ids: torch.Tensor, attention: torch.Tensor
) -> torch.Tensor:
    """``(B, T)`` log π(ids[t] | ids[:t]); 0 at padding and at each sequence's first token."""
    shifted = logits[:, :-1]
    if shifted.dtype != torch.float32:
        shifted = shifted.float()
    chosen = shifted.gather(-1, ids[:, 1:, None]).squeeze(-1)
    # gather - logsumexp reads the logits once; log_softmax would write a second (B, T, V).
    log_probs = F.pad(chosen - torch.logsumexp(shifted, dim=-1), (1, 0))
    return log_probs.masked_fill(~has_prefix(attention), 0.0)


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
