"""Padding-free packing: a micro-batch's sequences concatenated into one row, positions
restarting at 0 at each sequence, so that no padding token is computed. Each sequence attends
to itself only: by the variable-length kwargs flash attention takes (``cu_seq_lens_q``, ...,
as transformers' ``DataCollatorWithFlattening`` passes them), and for a model on SDPA by
``packed_sdpa``, which runs SDPA causally over each sequence's span — transformers' own SDPA
path would attend through a block-diagonal mask over the whole row, ``N²`` for ``N`` packed
tokens, more than the padded batch's ``B · T²``.

>>> packed = pack([[5, 6, 7], [8, 9]], torch.device("cpu"))
>>> packed.ids.tolist(), packed.position_ids.tolist()
([[5, 6, 7, 8, 9]], [[0, 1, 2, 0, 1]])
>>> packed.unpad(torch.tensor([[1.0, 2, 3, 4, 5]])).tolist()  # left-padded (B, T), 0 at padding
[[1.0, 2.0, 3.0], [0.0, 4.0, 5.0]]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["PACKED_SDPA", "Packed", "pack", "packed_sdpa", "supports_packing", "use_packed_sdpa"]

PACKED_SDPA = "llm_gym_packed_sdpa"  # its name among transformers' attention functions
_VARLEN = ("flash_attention_2", "flash_attention_3", PACKED_SDPA)  # take cu_seq_lens


@dataclass(frozen=True)
class Packed:
    """Sequences packed into one row: ``ids`` and ``position_ids`` ``(1, N)``; ``cu_seq_lens``
    ``(S + 1,)`` int32 (each sequence's start, then ``N``); ``rows`` and ``cols``: where each
    packed token sits in the left-padded ``(B, T)`` layout ``llm_gym.lm.tensors.left_pad`` gives."""

    ids: torch.Tensor
    position_ids: torch.Tensor
    cu_seq_lens: torch.Tensor
    max_length: int
    rows: torch.Tensor
    cols: torch.Tensor
    shape: tuple[int, int]

    def model_kwargs(self) -> dict[str, Any]:
        """A causal LM's forward arguments for the packed row (no attention mask: each
        sequence's span is told by ``cu_seq_lens``)."""
        return {
            "input_ids": self.ids, "position_ids": self.position_ids, "use_cache": False,
            "cu_seq_lens_q": self.cu_seq_lens, "cu_seq_lens_k": self.cu_seq_lens,
            "max_length_q": self.max_length, "max_length_k": self.max_length,
        }  # fmt: skip

    def unpad(self, values: torch.Tensor) -> torch.Tensor:
        """``(1, N)`` values of the packed tokens in the left-padded ``(B, T)`` layout (0 at
        padding), with autograd."""
        out = values.new_zeros(self.shape)
        return out.index_put((self.rows, self.cols), values[0])

    def pad(self, values: torch.Tensor) -> torch.Tensor:
        """The inverse: the left-padded ``(B, T)`` values of the packed tokens as ``(1, N)``."""
        return values[self.rows, self.cols][None]


def pack(sequences: Sequence[Sequence[int] | np.ndarray], device: torch.device) -> Packed:
    """``sequences`` packed into one row on ``device`` (see ``Packed``)."""
    lengths = np.array([len(s) for s in sequences], dtype=np.int64)
    if not len(lengths) or lengths.min() < 1:
        raise ValueError(
            "sequences must be one or more sequences of at least one token each, got lengths "
            f"{lengths.tolist()[:8]}"
        )
    width = int(lengths.max())
    starts = np.concatenate([[0], np.cumsum(lengths)])
    ids = np.concatenate([np.asarray(s, dtype=np.int64) for s in sequences])
    rows = np.repeat(np.arange(len(sequences)), lengths)
    positions = np.arange(len(ids)) - np.repeat(starts[:-1], lengths)
    cols = width - np.repeat(lengths, lengths) + positions

    def tensor(a: np.ndarray, dtype: torch.dtype = torch.long) -> torch.Tensor:
        return torch.from_numpy(a).to(device=device, dtype=dtype)

    return Packed(
        tensor(ids)[None], tensor(positions)[None], tensor(starts, torch.int32), width,
        tensor(rows), tensor(cols), (len(sequences), width),
    )  # fmt: skip


def packed_sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention, but over a packed row (``cu_seq_lens_q`` given) SDPA
    runs causally within each sequence's span: ``Σ L²`` rather than ``N²`` (the packed row's
    block-diagonal mask). ``query`` ``(1, H, N, D)``, ``key``, ``value`` ``(1, H_kv, N, D)``;
    the output ``(1, N, H, D)``, as transformers' attention functions return it."""
    cu_seq_lens = kwargs.get("cu_seq_lens_q")
    if cu_seq_lens is None:  # an ordinary batch (sampling, a padded forward)
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    gqa = query.shape[1] != key.shape[1]
    bounds = cu_seq_lens.tolist()
    spans = [
        F.scaled_dot_product_attention(
            query[:, :, a:b],
            key[:, :, a:b],
            value[:, :, a:b],
            is_causal=True,
            dropout_p=dropout if module.training else 0.0,
            scale=scaling,
            enable_gqa=gqa,
        )  # fmt: skip
        for a, b in zip(bounds[:-1], bounds[1:], strict=True)
    ]
    return torch.cat(spans, dim=2).transpose(1, 2).contiguous(), None


def supports_packing(model: torch.nn.Module) -> bool:
    """Whether ``model``'s attention keeps packed sequences apart: one of transformers' own
    models (remote code may build its masks without the packed positions) on a
    variable-length attention (flash attention, ``packed_sdpa``), or on SDPA, which
    ``use_packed_sdpa`` switches, where plain causal attention is the model's (no sliding
    window, no soft-capped scores: those ``packed_sdpa`` does not compute)."""
    config = getattr(model, "config", None)
    implementation = getattr(config, "_attn_implementation", None)
    # FSDP2 wraps the class in one of its own (FSDPLlamaForCausalLM): the model's is next.
    cls = next(c for c in type(model).__mro__ if not c.__module__.startswith("torch.distributed"))
    if not cls.__module__.startswith("transformers."):
        return False  # remote code may build its masks without the packed positions
    if implementation in _VARLEN:
        return True
    windowed = getattr(config, "sliding_window", None) is not None and getattr(
        config, "use_sliding_window", True
    )
    capped = getattr(config, "attn_logit_softcapping", None) is not None
    return implementation == "sdpa" and not windowed and not capped


def use_packed_sdpa(model: torch.nn.Module) -> None:
    """Switch a model on SDPA to ``packed_sdpa`` (the same SDPA on every other batch, its
    masks built as SDPA's); a variable-length attention is left as it is."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    if model.config._attn_implementation != "sdpa":
        return
    AttentionInterface.register(PACKED_SDPA, packed_sdpa)
    ALL_MASK_ATTENTION_FUNCTIONS.register(PACKED_SDPA, sdpa_mask)
    model.set_attn_implementation(PACKED_SDPA)
