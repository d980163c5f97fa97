"""The language-model tensor work every other package shares, in torch alone: tensors in,
tensors out, on the device of the tensors given. Padding is told by the attention mask only,
never by token id: with ``pad_token == eos_token`` a real EOS looks exactly like padding.

Log-probs: position ``t``'s logits predict token ``t + 1``; a sequence's first token has no
prefix and gets 0.0 (TorchRL's and vLLM's convention), as does padding. The CPU, accelerator
and compiled paths (``token_log_probs``) give the same values within 1e-5 in float32.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from llm_gym.lm.packing import Packed

__all__ = [
    "HEAP_MMAP_THRESHOLD",
    "LEAN_MMAP_THRESHOLD",
    "CompiledLogProbs",
    "LinearLogProbs",
    "first_eos_lengths",
    "first_id",
    "forward_logits",
    "gather_log_probs",
    "has_prefix",
    "keeps_logits",
    "left_pad",
    "log_probs_of",
    "next_token_log_probs",
    "position_ids",
    "set_host_mmap_threshold",
    "selected_log_probs",
    "token_log_probs",
]


def left_pad(
    sequences: Sequence[Sequence[int] | np.ndarray],
    pad_id: float,
    device: torch.device,
    dtype: type = np.int64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ``(B, T)`` ids (``dtype``, int64 by default; float32 for per-token values)
    and their bool attention mask, on ``device``.

    >>> ids, mask = left_pad([[1, 2], [3]], pad_id=9, device=torch.device("cpu"))
    >>> ids.tolist(), mask.tolist()
    ([[1, 2], [9, 3]], [[True, True], [False, True]])
    """
    length = max(len(s) for s in sequences)
    ids = np.full((len(sequences), length), pad_id, dtype=dtype)
    mask = np.zeros((len(sequences), length), dtype=bool)
    for row, seq in enumerate(sequences):
        ids[row, length - len(seq) :] = seq
        mask[row, length - len(seq) :] = True
    return torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device)


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted from each row's first real token, as transformers' generate does
    (absolute-position models would otherwise see a left-padded row shifted); padding gets 0.

    >>> position_ids(torch.tensor([[True, True], [False, True]])).tolist()
    [[0, 1], [0, 0]]
    """
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


# About 24 MB of float32 logits per chunk: log_softmax's temporary then stays in cache, which
# measured 2x faster on CPU than one logsumexp over the whole (B, T, V) batch (whose composite
# kernel writes several batch-sized temporaries), and peak memory stays flat.
_CHUNK_ELEMENTS = 6 * 2**20
# Eager fallback on an accelerator: fewer, larger chunks (each launch costs more than the
# arithmetic); 2**27 float32 elements is 512 MB of temporaries at most.
_DEVICE_CHUNK_ELEMENTS = 2**27


def keeps_logits(model: torch.nn.Module) -> bool:
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
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, keep: int = 0
) -> torch.Tensor:
    """The ``(B, T, V)`` logits of a padded batch (left or right; see ``position_ids``); with
    ``keep > 0`` the last ``keep`` only, through the model's ``logits_to_keep`` where it has one
    (the vocabulary projection then runs for those positions only), else sliced afterwards.
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

    ``compiled``: run the shared ``CompiledLogProbs`` kernel (``None``: on CUDA only); once it
    has failed, or with ``compiled=False``, the eager form runs in chunks of ``chunk_rows``
    rows (default: 2**27 elements a chunk).

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


class CompiledLogProbs:
    """``logit[target] - logsumexp(logits)`` through ``torch.compile``: float32 log-probs of
    logits ``(..., V)`` at targets ``(...)``. One kernel reads the logits once, where eager
    ``log_softmax`` writes a float32 copy of them.

    Compiled on the first call with dynamic shapes (batch and window sizes do not recompile
    it). A compiler that fails (no Triton, an unsupported platform) is reported once as a
    ``RuntimeWarning``; ``failed`` is then True and every call returns None, for the caller's
    eager form (``log_probs_of`` runs one shared instance).
    """

    def __init__(self) -> None:
        self.kernel: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
        self.failed = False

    def __call__(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
        """The log-probs, or None when the compiler failed (now or before)."""
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


_COMPILED = CompiledLogProbs()


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
    # The log-softmax over the vocabulary is most of the cost, and padding (a fifth of a GSM8K
    # batch) need not pay it. The span's logits are a view shifted by one, not a copy.
    width = ids.shape[1]
    spans = torch.stack(
        [scored.any(1), scored.int().argmax(1), width - scored.flip(1).int().argmax(1)], dim=1
    ).tolist()  # (any scored, first, end) per row, in one device sync
    for row, (any_scored, first, end) in enumerate(spans):
        if any_scored:
            span = gather_log_probs(logits[row, first - 1 : end - 1], ids[row, first:end])
            log_probs[row, first:end] = span
    return log_probs.masked_fill(~scored, 0.0)


# Config fields of models whose logits are more than the output layer's product (Gemma's
# soft-capping, Cohere's and Granite's scales): their log-probs come from the logits.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def selected_log_probs(
    model: torch.nn.Module,
    ids: torch.Tensor,
    attention: torch.Tensor,
    selected: torch.Tensor,
    *,
    chunk_rows: int | None = None,
    entropy: bool = False,
    entropy_grad: bool = False,
    packed: Packed | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``(B, T)`` float32 log π(ids[t] | ids[:t]) at the ``selected`` positions of a padded
    batch, 0 elsewhere, with autograd: the same values as ``token_log_probs`` of the whole
    logits, without ever holding them. With ``entropy``, also the ``(B, T)`` entropy of π at
    those positions from the same chunks of logits, with autograd where ``entropy_grad`` (an
    entropy bonus in the loss), else none. ``packed``: the same
    sequences packed into one row (``llm_gym.lm.packing.pack``), which the model runs on
    instead: no padding token is computed, and the result is the same.

    The model's last hidden states at the positions that predict a selected token go through
    its output layer ``chunk_rows`` rows at a time, forward and backward (``LinearLogProbs``):
    a response's tokens pay for the vocabulary, the prompt and the padding do not, and one
    chunk's ``(rows, V)`` logits are the most that exists at once (the fused linear
    cross-entropy of Liger-Kernel, in torch alone). A model whose logits are more than the
    output layer's product (soft-capped, scaled) takes the whole-logits path.
    """
    selected = selected & has_prefix(attention)
    if hasattr(model, "peft_config") and hasattr(model, "get_base_model"):
        model = model.get_base_model()  # a LoRA model: its layers hold the adapters in place
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    base = getattr(model, getattr(model, "base_model_prefix", ""), None)
    config = getattr(model, "config", None)
    transformed = any(getattr(config, name, None) not in (None, 1.0) for name in _LOGIT_TRANSFORMS)
    rows, positions = selected.nonzero(as_tuple=True)
    out = torch.zeros(ids.shape, dtype=torch.float32, device=ids.device)
    if packed is None:
        forward = {"input_ids": ids, "attention_mask": attention.long(), "use_cache": False}
        forward["position_ids"] = position_ids(attention)
        before = (rows, positions - 1)  # where the positions predicting the selected ones sit
    else:
        forward = packed.model_kwargs()
        index = torch.zeros(ids.shape, dtype=torch.long, device=ids.device)
        index[packed.rows, packed.cols] = torch.arange(len(packed.rows), device=ids.device)
        before = (0, index[rows, positions - 1])

    def result(
        picked: torch.Tensor, entropies: torch.Tensor | None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        log_probs = out.index_put((rows, positions), picked)
        if not entropy:
            return log_probs
        if not entropy_grad:
            entropies = entropies.detach()
        return log_probs, torch.zeros_like(out).index_put((rows, positions), entropies)

    if not isinstance(head, torch.nn.Linear) or base is None or transformed:
        logits = model(**forward).logits[before]
        entropies = None
        if entropy_grad:
            entropies = _entropy(logits)
        elif entropy:
            with torch.no_grad():
                rows_at_once = max(1, _DEVICE_CHUNK_ELEMENTS // max(logits.shape[-1], 1))
                entropies = torch.cat([_entropy(c) for c in logits.split(rows_at_once)])
        return result(log_probs_of(logits, ids[rows, positions]), entropies)
    hidden = base(**forward).last_hidden_state
    if chunk_rows is None:
        budget = _CHUNK_ELEMENTS if ids.device.type == "cpu" else _DEVICE_CHUNK_ELEMENTS
        chunk_rows = max(1, budget // head.weight.shape[0])
    picked = LinearLogProbs.apply(
        hidden[before], head.weight, head.bias, ids[rows, positions], chunk_rows, entropy
    )  # fmt: skip
    return result(*picked) if entropy else result(picked, None)


def _entropy(logits: torch.Tensor) -> torch.Tensor:
    # H = logsumexp(z) - Σ softmax(z) z, in float32 whatever the logits' dtype.
    logits = logits.float()
    return torch.logsumexp(logits, -1) - (torch.softmax(logits, -1) * logits).sum(-1)


class LinearLogProbs(torch.autograd.Function):
    """``log_softmax(hidden @ weight.T + bias)[i, targets[i]]`` in float32 for ``hidden``
    ``(N, H)``, ``weight`` ``(V, H)``, ``targets`` ``(N,)``, ``rows`` rows of logits at a
    time; the backward recomputes each chunk's logits rather than keeping them (one more
    matrix product, for memory that does not grow with N · V). With ``entropy``, a second
    output: each row's entropy, from the same chunks, with its gradient (``-p (z - E_p[z])``
    with respect to the logits ``z``).

    >>> h, w = torch.randn(5, 3, requires_grad=True), torch.randn(7, 3, requires_grad=True)
    >>> t = torch.tensor([0, 6, 2, 2, 1])
    >>> fused, entropy = LinearLogProbs.apply(h, w, None, t, 2, True)
    >>> full = torch.log_softmax(h @ w.T, -1)
    >>> picked, full_entropy = full.gather(-1, t[:, None]).squeeze(-1), -(full.exp() * full).sum(-1)
    >>> loss, full_loss = fused.sum() + 0.5 * entropy.sum(), picked.sum() + 0.5 * full_entropy.sum()
    >>> torch.allclose(fused, picked), torch.allclose(entropy, full_entropy, atol=1e-6)
    (True, True)
    >>> [torch.allclose(a, b, atol=1e-5) for a, b in zip(
    ...     torch.autograd.grad(loss, (h, w)), torch.autograd.grad(full_loss, (h, w)))]
    [True, True]
    """

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        rows: int,
        entropy: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        entropies = torch.empty_like(out) if entropy else None
        for start in range(0, hidden.shape[0], rows):
            stop = start + rows
            logits = F.linear(hidden[start:stop], weight, bias).float()
            out[start:stop] = _picked_minus_logsumexp(logits, targets[start:stop])
            if entropies is not None:
                entropies[start:stop] = _entropy(logits)
        ctx.save_for_backward(hidden, weight, bias, targets)
        ctx.rows = rows
        ctx.set_materialize_grads(False)  # an output the loss leaves out: its gradient None
        # Under autocast (mixed precision) the backward's products run in its dtype too: a
        # custom Function's backward runs outside the forward's autocast otherwise.
        kind = hidden.device.type
        ctx.autocast = (kind, torch.get_autocast_dtype(kind), torch.is_autocast_enabled(kind))
        return (out, entropies) if entropy else out

    @staticmethod
    def backward(
        ctx: Any, grad_out: torch.Tensor | None, grad_entropy: torch.Tensor | None = None
    ) -> tuple[torch.Tensor | None, ...]:
        hidden, weight, bias, targets = ctx.saved_tensors
        needs_hidden, needs_weight, needs_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.empty_like(hidden) if needs_hidden else None
        grad_weight = torch.zeros_like(weight) if needs_weight else None
        grad_bias = torch.zeros_like(bias) if bias is not None and needs_bias else None
        kind, dtype, mixed = ctx.autocast
        with torch.autocast(kind, dtype=dtype, enabled=mixed):
            for start in range(0, hidden.shape[0], ctx.rows):
                stop = start + ctx.rows
                chunk = hidden[start:stop]
                logits = F.linear(chunk, weight, bias).float()
                # d log_softmax(z)[t] / dz = onehot(t) - p, times the incoming gradient g;
                # d H / dz = -p (z - E_p[z]), times the entropy's h: together
                # onehot(t) g - p (g + h (z - E_p[z])), in place where it can be.
                p = torch.softmax(logits, dim=-1)
                if grad_out is None:
                    g = torch.zeros(len(chunk), 1, device=logits.device)
                else:
                    g = grad_out[start:stop, None].float()
                if grad_entropy is None:
                    dlogits = p.mul_(-g)
                else:
                    h = grad_entropy[start:stop, None].float()
                    logits.sub_((p * logits).sum(-1, keepdim=True)).mul_(h).add_(g)
                    dlogits = p.mul_(logits).neg_()
                dlogits.scatter_add_(-1, targets[start:stop, None], g)
                dlogits = dlogits.to(weight.dtype)
                if grad_hidden is not None:
                    grad_hidden[start:stop] = dlogits @ weight
                if grad_weight is not None:
                    if mixed:  # the product in autocast's dtype (addmm_ in place never is)
                        grad_weight += dlogits.T @ chunk
                    else:  # in place: no (V, H) temporary
                        grad_weight.addmm_(dlogits.T, chunk)
                if grad_bias is not None:
                    grad_bias += dlogits.sum(0)
        return grad_hidden, grad_weight, grad_bias, None, None, None


def next_token_log_probs(
    model: torch.nn.Module,
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


def first_id(*candidates: int | Sequence[int] | np.ndarray | None, default: int) -> int:
    """The first candidate that is not None (the first of a list), as an int."""
    for candidate in candidates:
        if candidate is not None:
            return int(np.atleast_1d(candidate)[0])
    return default


def first_eos_lengths(tokens: torch.Tensor, eos_token_ids: list[int]) -> torch.Tensor:
    """Tokens up to and including the first EOS of each row; all of them when there is none.

    >>> first_eos_lengths(torch.tensor([[5, 2, 7], [5, 6, 7]]), eos_token_ids=[2]).tolist()
    [2, 3]
    """
    full = torch.full((tokens.shape[0],), tokens.shape[1], dtype=torch.long, device=tokens.device)
    if not eos_token_ids or tokens.shape[1] == 0:
        return full
    is_eos = torch.isin(tokens, torch.tensor(eos_token_ids, dtype=torch.long, device=tokens.device))
    return torch.where(is_eos.any(1), is_eos.long().argmax(1) + 1, full)


# glibc's mallopt parameter: blocks of at least this many bytes are mmapped, not heap.
_M_MMAP_THRESHOLD = -3
# What an update on CPU sets (freed tensors from 1 MiB up go back at once), and glibc's own
# ceiling for its moving threshold (32 MiB on 64-bit), which sampling runs best at.
LEAN_MMAP_THRESHOLD = 1 << 20
HEAP_MMAP_THRESHOLD = 32 << 20


def set_host_mmap_threshold(threshold: int) -> bool:
    """Have glibc map blocks of ``threshold`` bytes or more on their own, given back to the
    system as soon as they are freed; True where it took the setting (glibc), False
    elsewhere (nothing changes).

    glibc keeps a freed block below its threshold for reuse and raises the threshold (up to
    32 MiB) as large blocks are freed, so on CPU an update's activations, freed layer by
    layer in the backward, stay in the process's memory in pieces the next sizes do not fit:
    one GRPO update of 16 × 700 tokens peaked at 4.2 GB RSS where 2.8 GB is enough with
    ``LEAN_MMAP_THRESHOLD`` (``scripts/bench_train_memory.py``), for about a fifth more time
    (each large tensor's pages are mapped afresh). Generation, which allocates and frees
    tensors of a few MiB every token, is a fifth slower with it too: set
    ``HEAP_MMAP_THRESHOLD`` back after the update. The setting is the process's.
    """
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, int(threshold)))
