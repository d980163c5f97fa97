"""Per-token log-probs of a causal LM's forward pass, over left-padded batches.

Position ``t``'s logits predict token ``t + 1``, so each scored token is read from the logits
one position before it; a sequence's first token has no prefix and gets 0.0 (TorchRL's and
vLLM's convention), as does padding. Everything runs on the device of the logits given.

Two paths give the same values (within 1e-5 in float32), chosen by the logits' device:

- CPU: row by row over each row's scored span, in cache-sized chunks of ``log_softmax``
  (a forward is compute-bound there; skipping padding saves work);
- accelerators: the whole window at once, ``gather - logsumexp`` with no host sync. On CUDA
  this is one compiled kernel (``torch.compile``) that reads the logits once, in their own
  dtype, and writes only the ``(B, T)`` result: eager ``log_softmax`` writes a float32 copy
  of the ``(B, T, V)`` logits and reads it back several times, which at 128 responses costs
  more than the forward. Without a working compiler it falls back to eager chunks.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from llm_gym.lm.padding import position_ids

__all__ = [
    "forward_logits",
    "gather_log_probs",
    "has_prefix",
    "log_probs_of",
    "keeps_logits",
    "next_token_log_probs",
    "token_log_probs",
]

# About 24 MB of float32 logits per chunk: log_softmax's temporary then stays in cache, which
# measured 2x faster on CPU than one logsumexp over the whole (B, T, V) batch (whose composite
# kernel writes several batch-sized temporaries), and peak memory stays flat.
_CHUNK_ELEMENTS = 6 * 2**20
# Eager fallback on an accelerator: fewer, larger chunks (each launch costs more than the
# arithmetic); 2**27 float32 elements is 512 MB of temporaries at most.
_DEVICE_CHUNK_ELEMENTS = 2**27


def keeps_logits(model: Any) -> bool:
    """Whether a causal LM's forward takes ``logits_to_keep`` (most transformers models do)."""
    forward = getattr(model, "forward", model)
    return _takes_logits_to_keep(getattr(forward, "__func__", forward))  # one lookup per class


@functools.cache
def _takes_logits_to_keep(function: Any) -> bool:
    try:
        return "logits_to_keep" in inspect.signature(function).parameters
    except (TypeError, ValueError):  # builtins and some C callables have no signature
        return False


def forward_logits(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, keep: int = 0
) -> torch.Tensor:
    """The ``(B, T, V)`` logits of a padded batch; with ``keep > 0`` the last ``keep`` only.

    Positions are counted from each row's first real token (left or right padding alike).
    ``keep`` uses the model's ``logits_to_keep`` where it has one, so the vocabulary
    projection runs for those positions only; other models are sliced afterwards.
    """
    kwargs = {"logits_to_keep": keep} if keep and keeps_logits(model) else {}
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask.long(),
        position_ids=position_ids(attention_mask),
        use_cache=False,
        **kwargs,
    )
    return out.logits[:, -keep:] if keep else out.logits


def gather_log_probs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``log_softmax(logits)[i, targets[i]]`` for ``(N, V)`` logits, in float32.

    >>> logits = torch.tensor([[0.0, 0.0], [2.0, 2.0]])
    >>> [round(x, 4) for x in gather_log_probs(logits, torch.tensor([0, 1])).tolist()]
    [-0.6931, -0.6931]
    """
    if logits.device.type != "cpu":
        return log_probs_of(logits, targets)
    rows = max(1, _CHUNK_ELEMENTS // logits.shape[-1])
    return _chunked(_log_softmax_gather, logits, targets, rows)


def log_probs_of(
    logits: torch.Tensor,
    targets: torch.Tensor,
    compiled: bool | None = None,
    *,
    chunk_rows: int | None = None,
) -> torch.Tensor:
    """``log_softmax(logits.float())`` at ``targets`` for logits ``(..., V)`` and targets
    ``(...)``, as ``logit[target] - logsumexp(logits)``: one pass over the logits, float32 out.

    ``compiled``: run the ``torch.compile`` kernel (``None``: on CUDA only). A compiler
    that fails (no Triton, an unsupported platform) is reported once and the eager form,
    in chunks of ``chunk_rows`` rows (default: 2**27 elements a chunk), is used from then on.

    >>> logits = torch.tensor([[[0.0, 0.0], [1.0, 3.0]]])
    >>> [round(x, 4) for x in log_probs_of(logits, torch.tensor([[0, 1]]))[0].tolist()]
    [-0.6931, -0.1269]
    """
    if logits.shape[:-1] != targets.shape:
        raise ValueError(
            f"targets must have the logits' leading shape {tuple(logits.shape[:-1])}, got "
            f"{tuple(targets.shape)}"
        )
    if compiled is None:
        compiled = logits.device.type == "cuda"
    if compiled and logits.numel():
        out = _COMPILED(logits, targets)
        if out is not None:
            return out
    rows = chunk_rows or max(1, _DEVICE_CHUNK_ELEMENTS // max(logits.shape[-1], 1))
    flat = logits.reshape(-1, logits.shape[-1])
    return _chunked(_picked_minus_logsumexp, flat, targets.reshape(-1), rows).view(targets.shape)


def _chunked(pick: Callable, logits: torch.Tensor, targets: torch.Tensor, rows: int) -> Any:
    """``pick(logits, targets)`` of ``(N, V)`` logits, ``rows`` rows at a time, float32 out."""
    chunks = zip(logits.split(rows), targets.split(rows), strict=True)
    return torch.cat([pick(lg, tg).float() for lg, tg in chunks])


def _log_softmax_gather(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, targets[:, None]).squeeze(-1)


def _picked_minus_logsumexp(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = logits.float()
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


class _CompiledKernel:
    """``_picked_minus_logsumexp`` through ``torch.compile``, compiled on first use with
    dynamic shapes (batch and window sizes do not recompile it); ``None`` once it failed."""

    def __init__(self) -> None:
        self.kernel: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
        self.failed = False

    def __call__(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
        if self.failed:
            return None
        if self.kernel is None:
            self.kernel = torch.compile(_picked_minus_logsumexp, dynamic=True, fullgraph=True)
        try:
            return self.kernel(logits, targets)
        except Exception as error:  # noqa: BLE001  (any compiler failure: fall back)
            self.failed = True
            warnings.warn(
                f"torch.compile of the log-prob kernel failed ({type(error).__name__}: "
                f"{str(error)[:200]}); using the eager form, which is slower on a GPU",
                RuntimeWarning,
                stacklevel=3,
            )
            return None


_COMPILED = _CompiledKernel()


def has_prefix(attention: torch.Tensor) -> torch.Tensor:
    """Real tokens that have at least one real token before them (padding is by mask only)."""
    before = F.pad(attention[:, :-1], (1, 0), value=False)
    return attention & before


def token_log_probs(
    logits: torch.Tensor,
    ids: torch.Tensor,
    attention: torch.Tensor,
    *,
    window: bool | None = None,
    compiled: bool | None = None,
) -> torch.Tensor:
    """``(B, T)`` log π(ids[t] | ids[:t]); 0 at padding and at each sequence's first token.

    ``window``: score the whole ``(B, T)`` window in one call, padding included and zeroed
    after (``None``: off the CPU, where a launch per row costs more); else row by row over each
    row's scored span. ``compiled`` as for ``log_probs_of``. All paths give the same values.
    """
    scored = has_prefix(attention)
    log_probs = torch.zeros(ids.shape, dtype=torch.float32, device=logits.device)
    if window if window is not None else logits.device.type != "cpu":
        if ids.shape[1] > 1:
            log_probs[:, 1:] = log_probs_of(logits[:, :-1], ids[:, 1:], compiled)
        return log_probs.masked_fill(~scored, 0.0)
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


def next_token_log_probs(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    allowed: torch.Tensor | None = None,
) -> torch.Tensor:
    """log π(· | s) over the vocabulary after the last position of left-padded rows ``(B, L)``.

    ``allowed``: a bool mask over the first ``len(allowed)`` token ids; the distribution is
    renormalized over those.
    """
    with torch.inference_mode():
        logits = forward_logits(model, input_ids, attention_mask, keep=1)[:, -1].float()
        if allowed is not None:
            logits = logits[:, : allowed.shape[0]].masked_fill(~allowed, float("-inf"))
        return torch.log_softmax(logits, dim=-1)
