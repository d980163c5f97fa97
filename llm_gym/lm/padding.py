"""Left padding for decoder-only models, and the positions that go with it.

Padding is told by the attention mask only, never by token id: with ``pad_token ==
eos_token`` a real EOS looks exactly like padding.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

__all__ = ["left_pad", "position_ids"]


def left_pad(
    sequences: Sequence[Sequence[int] | np.ndarray], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ``(B, T)`` int64 ids and their bool attention mask, on ``device``.

    >>> ids, mask = left_pad([[1, 2], [3]], pad_id=9, device=torch.device("cpu"))
    >>> ids.tolist(), mask.tolist()
    ([[1, 2], [9, 3]], [[True, True], [False, True]])
    """
    length = max(len(s) for s in sequences)
    ids = np.full((len(sequences), length), pad_id, dtype=np.int64)
    mask = np.zeros((len(sequences), length), dtype=bool)
    for row, seq in enumerate(sequences):
        ids[row, length - len(seq) :] = seq
        mask[row, length - len(seq) :] = True
    return torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device)


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted from each row's first real token, as transformers' generate does.

    Absolute-position models (GPT-2) would otherwise see a left-padded row shifted by its
    padding; padding itself gets position 0.
    """
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
