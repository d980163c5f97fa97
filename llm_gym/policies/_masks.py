"""The position masks of ``get_dist`` (prompt, assistant, attention or custom), left-padded."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from llm_gym.policies._inputs import Encoded

__all__ = ["DIST_MASKS", "dist_mask"]

# get_dist mask names; the second of each pair is TorchRL's name for the use case.
DIST_MASKS = {"prompt": "prompt", "sft": "prompt", "assistant": "assistant", "rlhf": "assistant"}
DIST_MASKS |= {"attention": "attention", "generic": "attention"}


def dist_mask(mask: Any, encoded: list[Encoded], attention: torch.Tensor) -> torch.Tensor:
    """The ``(B, T)`` bool mask ``mask`` names (or gives), in the padded layout of ``attention``."""
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
