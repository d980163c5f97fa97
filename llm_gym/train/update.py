"""GRPO's update of a model on one batch of token sequences: micro-batches by a token
budget, the old policy's and the reference's log-probs, the loss (``llm_gym.train.loss``,
TRL's variants) over each micro-batch, the optimizer's steps, and what the update did (its
diagnostics, a metrics row's part). ``GRPOTrainer`` runs one per iteration."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from llm_gym.checks import check_choice
from llm_gym.lm.lora import is_lora, unwrapped
from llm_gym.lm.packing import pack, supports_packing, use_packed_sdpa
from llm_gym.lm.precision import autocast, runs_fast
from llm_gym.lm.tensors import (
    HEAP_MMAP_THRESHOLD,
    LEAN_MMAP_THRESHOLD,
    has_prefix,
    left_pad,
    selected_log_probs,
    set_host_mmap_threshold,
)
from llm_gym.run.budget import activation_bytes, available_memory
from llm_gym.train.config import CHECKPOINT_TOKENS, PRECISIONS
from llm_gym.train.loss import (
    EntropyBonus,
    at_policy_tokens,
    grpo_loss,
    microbatch_tokens,
    microbatches,
    truncated_is_weights,
    update_stats,
)
from llm_gym.train.optim import lr_scheduler, warmup_steps
from llm_gym.train.sharding import all_reduce, is_sharded, note

if TYPE_CHECKING:
    from llm_gym.train.config import GRPOConfig

__all__ = [
    "PRECISION_WEIGHTS",
    "EpochStep",
    "GRPOUpdate",
    "UpdatePlan",
    "resolve_precision",
    "training_forwards",
]

# The trained weights' dtype under each precision (GRPOConfig.precision).
PRECISION_WEIGHTS = {"fp32": torch.float32, "bf16-mixed": torch.float32, "bf16": torch.bfloat16}


@dataclass
class UpdatePlan:
    """How one update runs (``GRPOUpdate.plan``): its micro-batches (``batches``: rows of
    the batch; those past ``real`` are a sharded update's fillers, forwards and backwards of
    weight 0), the batch's ``responses`` and policy tokens (``num_tokens``; every process's
    when sharded), which micro-batches recompute their activations in the backward
    (``checkpointed``), and whether the host hands freed memory back at once (``lean``)."""

    batches: list[list[int]]
    real: int
    responses: int
    num_tokens: int
    checkpointed: list[bool]
    lean: bool


@dataclass
class EpochStep:
    """What one optimizer step over a batch did (``GRPOUpdate.epoch``): the summed loss of
    its micro-batches, the diagnostics' sums (``update_stats``', the entropy's), the
    gradient's norm before clipping and the learning rate it stepped with."""

    loss: float
    stats: dict[str, float]
    grad_norm: float
    learning_rate: float


def resolve_precision(
    precision: str, device: torch.device, weights: torch.dtype | None = None
) -> str:
    """``precision`` (one of ``PRECISIONS``) with ``"auto"`` resolved for ``device`` and, for
    a model given, its ``weights``' dtype: weights below float32 train as they are ("bf16":
    through float32 masters); else "bf16-mixed" on a GPU that runs bfloat16 fast, "fp32"
    elsewhere (on a CPU autocast's casts cost more than its products save). A precision
    that the given weights contradict is a ``ValueError``.

    >>> resolve_precision("auto", torch.device("cpu"))
    'fp32'
    >>> resolve_precision("bf16-mixed", torch.device("cpu"), torch.bfloat16)
    Traceback (most recent call last):
    ...
    ValueError: precision 'bf16-mixed' trains float32 weights; the model given holds ...
    """
    check_choice("precision", precision, PRECISIONS)
    low = weights is not None and weights != torch.float32
    if precision == "auto":
        if low:
            return "bf16"
        fast = device.type == "cuda" and runs_fast(torch.bfloat16, device)
        return "bf16-mixed" if fast else "fp32"
    if weights is not None and low != (PRECISION_WEIGHTS[precision] != torch.float32):
        wanted = "'bf16' or 'auto'" if low else "'fp32', 'bf16-mixed' or 'auto'"
        raise ValueError(
            f"precision {precision!r} trains {str(PRECISION_WEIGHTS[precision])[6:]} weights; "
            f"the model given holds {weights}: pass precision={wanted}"
        )
    return precision


@contextlib.contextmanager
def training_forwards(
    model: torch.nn.Module, *, dropout: bool, checkpointing: bool
) -> Iterator[None]:
    """Inside, ``model``'s forwards and their backwards run with dropout only if ``dropout``
    (train mode; else eval mode, which turns off every dropout whatever the architecture: the
    ``nn.Dropout`` modules, the attention's and the layers' functional dropout, layer drop),
    and with each decoder layer whose checkpointing is enabled (transformers'
    ``gradient_checkpointing_enable``) recomputed in the backward only if ``checkpointing``.
    transformers checkpoints a layer only in train mode, which would tie the two; here torch's
    checkpoint (the layer's own ``_gradient_checkpointing_func``) wraps the layer's forward in
    either mode, outside its hooks as transformers does. For forwards without a KV cache (a
    recompute would write one twice). On leaving, the model is in eval mode, sampling's, its
    layers as they were.

    >>> from llm_gym.lm.loading import tiny_model
    >>> model = tiny_model(vocab_size=16, arch="gpt2")
    >>> with training_forwards(model, dropout=False, checkpointing=False):
    ...     model.training, model.transformer.drop.training
    (False, False)
    >>> with training_forwards(model, dropout=True, checkpointing=False):
    ...     model.transformer.drop.training
    True
    >>> model.training
    False
    """
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [
        module
        for module in model.modules()
        if isinstance(module, GradientCheckpointingLayer) and module.gradient_checkpointing
    ]
    own = [layer.__dict__.get("forward") for layer in layers]  # a hook's (accelerate's), if any
    model.train(dropout)
    try:
        for layer in layers:
            layer.gradient_checkpointing = False  # transformers' own switch, tied to train mode
            if checkpointing:
                layer.forward = _checkpointed(layer)
        yield
    finally:
        for layer, forward in zip(layers, own, strict=True):
            layer.gradient_checkpointing = True
            if forward is None:
                layer.__dict__.pop("forward", None)
            else:
                layer.forward = forward
        model.eval()


def _checkpointed(layer: torch.nn.Module) -> Any:
    # The layer's forward through its checkpoint function; without gradients there is no
    # backward to replay it for, so it runs as it is.
    forward, recompute = layer.forward, layer._gradient_checkpointing_func

    def run(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        return recompute(functools.partial(forward, **kwargs), *args)

    return run


class GRPOUpdate:
    """The update of ``model`` by ``optimizer`` with ``config``'s GRPO settings (loss type,
    clipping, KL term, truncated IS, epochs, micro-batches, checkpointing, precision), padding
    with ``pad_id``; ``reference``: a scorer of the starting model (``.model``) for
    ``kl_loss_coef`` (a LoRA model is its own, its adapter disabled). Under "bf16-mixed" every
    forward of the update (the old policy's, the reference's, the loss's) and its backward run
    under bfloat16 autocast over the float32 weights. Every forward runs without dropout (the
    loss's too, unless ``keep_dropout``, as TRL's ``disable_dropout``), checkpointed or not
    (``training_forwards``); the model is in eval mode before and after each update, as
    sampling needs it. The learning rate follows ``config.lr_schedule`` over the run's
    optimizer steps from step ``done`` (``lr_scheduler``)."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        config: GRPOConfig,
        pad_id: int,
        *,
        reference: Any = None,
        done: int = 0,
    ) -> None:
        if config.kl_loss_coef > 0 and reference is None and not is_lora(model):
            raise ValueError("kl_loss_coef > 0 needs the reference (the starting model's scorer)")
        self.model, self.optimizer, self.config = model, optimizer, config
        self.pad_id, self.reference = pad_id, reference
        self.loss_options = {  # how grpo_loss and update_stats read the ratio
            "loss_type": config.loss_type, "clip_coef_high": config.clip_coef_high,
            "importance_sampling_level": config.importance_sampling_level,
        }  # fmt: skip
        # The learning rate over the run's optimizer steps, at step `done` (a resumed run's).
        self.entropy_bonus = EntropyBonus(
            config.entropy_coef, config.entropy_target, config.entropy_coef_delta,
            config.entropy_coef_min, config.entropy_coef_max,
        )  # fmt: skip
        steps = config.iterations * config.update_epochs
        self.scheduler = lr_scheduler(
            optimizer,
            config.lr_schedule,
            warmup_steps(config.warmup_steps, steps, config.lr_schedule),
            steps,
            done=done,
        )
        model.eval()  # sampling's mode, before the first update too (a model may come in train)
        weights = next(model.parameters())
        self.device = weights.device
        self.precision = resolve_precision(config.precision, self.device, weights.dtype)
        mixed = torch.bfloat16 if self.precision == "bf16-mixed" else None
        self.autocast = lambda: autocast(self.device, mixed, weights.dtype)
        # Activation checkpointing by default: on CUDA where a micro-batch's activations would
        # not fit in the free memory; on the CPU for large micro-batches (whose activations
        # are the process's peak).
        self.by_memory = self.device.type == "cuda"
        self.stepped = False  # AdamW's state exists from the first step on
        # Sharded (llm_gym.train.sharding): every process runs as many forwards and backwards
        # as the others (their collectives pair up), its loss divided by the whole batch's
        # counts, the gradients summed.
        self.sharded = is_sharded(model)
        # Packing: each micro-batch one row, no padding computed (llm_gym.lm.packing); a
        # model whose attention could not keep the sequences apart runs padded.
        self.packing = config.packing and supports_packing(unwrapped(model))
        if config.packing and not self.packing:
            attention = getattr(unwrapped(model).config, "_attn_implementation", None)
            note(
                f"packing is off: the model's attention ({attention}) cannot keep packed "
                "sequences apart, so micro-batches run padded (the same result, more compute; "
                "SDPA or flash attention packs)"
            )
        if self.packing:
            use_packed_sdpa(unwrapped(model))
            if reference is not None and not is_lora(model):
                use_packed_sdpa(reference.model)

    def __call__(
        self,
        tokens: Sequence[np.ndarray],
        masks: Sequence[np.ndarray],
        advantages: Sequence[np.ndarray],
        sampled_log_probs: Sequence[np.ndarray] | None = None,
    ) -> dict[str, Any]:
        """``update_epochs`` optimizer steps over the conversations ``tokens``, the loss on
        each one's ``masks`` (``(T,)`` bools) with its ``advantages``, one a token (a
        ``(T,)`` float32 array a conversation, whatever the estimator:
        ``llm_gym.train.advantages.per_token_advantages`` spreads one a conversation);
        ``sampled_log_probs``: the log-probs each policy token was sampled with, which an
        asynchronous run's ratio is taken to and ``tis_cap`` weighs toward. The metrics row's
        part: the loss and the update's diagnostics."""
        config = self.config
        plan = self.plan(tokens, masks)
        old, refs = self.old_and_reference(tokens, masks, plan, sampled_log_probs)
        if plan.lean:
            set_host_mmap_threshold(LEAN_MMAP_THRESHOLD)
        try:
            for epoch in range(config.update_epochs):
                last = epoch == config.update_epochs - 1  # the diagnostics are the last's
                step = self.epoch(
                    tokens, masks, advantages, plan, old, refs, sampled_log_probs, last=last
                )
        finally:
            self.model.eval()
            if plan.lean:
                set_host_mmap_threshold(HEAP_MMAP_THRESHOLD)
        return self._row(step, sampled_log_probs is not None and config.tis_cap is not None)

    def plan(self, tokens: Sequence[np.ndarray], masks: Sequence[np.ndarray]) -> UpdatePlan:
        """How an update of ``tokens`` (their ``masks``: the tokens the loss reads) runs: its
        micro-batches by the token budget, the batch's counts (every process's, when
        sharded), which micro-batches recompute their activations, whether the host hands
        freed memory back at once."""
        config, responses = self.config, len(tokens)
        lengths = [len(t) for t in tokens]
        batches = microbatches(
            lengths, config.max_tokens_per_microbatch, config.minibatch_size, packed=self.packing
        )
        num_tokens = sum(int(np.count_nonzero(np.asarray(m)[1:])) for m in masks)
        real = len(batches)  # the micro-batches past these are a sharded update's fillers
        if self.sharded:
            if not responses:
                raise ValueError("a sharded update needs responses on every process, got none")
            responses, num_tokens = (int(v) for v in all_reduce([responses, num_tokens],
                                                                 device=self.device))  # fmt: skip
            most = int(all_reduce([real], "max", self.device)[0])
            batches += [batches[0][:1]] * (most - real)  # forwards and backwards of weight 0

        def size(rows: list[int]) -> int:
            return microbatch_tokens([lengths[i] for i in rows], self.packing)

        # Large for the run's budget, not only in absolute terms: a budget of 2048 fills
        # micro-batches of 1400 tokens of long sequences, whose activations are its peak.
        threshold = min(CHECKPOINT_TOKENS, config.max_tokens_per_microbatch // 2)
        if config.gradient_checkpointing is not None:
            checkpointed = [config.gradient_checkpointing] * len(batches)
        elif self.by_memory:
            checkpointed = [self._short_of_memory(size(rows)) for rows in batches]
        else:  # large for the budget, or activations beyond the weights' own bytes
            checkpointed = [size(rows) >= threshold or self._heavy(size(rows)) for rows in batches]
        if self.sharded:  # the same on every process: a recompute gathers the layer's weights
            checkpointed = [v > 0 for v in all_reduce(checkpointed, "max", self.device)]
        # On CPU a large update's peak is the process's memory: its freed activations go back
        # to the system at once, and sampling gets glibc's usual threshold back after it
        # (unless the environment sets the threshold itself).
        lean = (
            self.device.type == "cpu" and "MALLOC_MMAP_THRESHOLD_" not in os.environ
            and any(checkpointed)
        )  # fmt: skip
        return UpdatePlan(batches, real, responses, num_tokens, checkpointed, lean)

    def old_and_reference(
        self,
        tokens: Sequence[np.ndarray],
        masks: Sequence[np.ndarray],
        plan: UpdatePlan,
        sampled_log_probs: Sequence[np.ndarray] | None = None,
    ) -> tuple[list[torch.Tensor | None], list[torch.Tensor | None]]:
        """Each micro-batch's old policy log-probs and the reference's (``(B, T)``, or None
        where the update does not need them). The old policy runs through the very forward
        the update uses, and only with several epochs: with one the first forward is the old
        policy itself (ratio 1, as TRL does); an asynchronous run's ratio is taken to
        ``sampled_log_probs`` instead. The reference's (``kl_loss_coef``) once for every
        epoch."""
        config = self.config
        own = config.update_epochs > 1 and not (
            config.asynchronous and sampled_log_probs is not None
        )
        old: list[torch.Tensor | None] = [None] * len(plan.batches)
        refs: list[torch.Tensor | None] = [None] * len(plan.batches)
        if own or config.kl_loss_coef > 0:
            with torch.no_grad():
                for j, rows in enumerate(plan.batches):
                    if own:
                        old[j] = self._scored(tokens, masks, rows)[0]
                    if config.kl_loss_coef > 0:
                        refs[j] = self._reference_log_probs(*self._padded(tokens, masks, rows))
        return old, refs

    def epoch(
        self,
        tokens: Sequence[np.ndarray],
        masks: Sequence[np.ndarray],
        advantages: Sequence[np.ndarray],
        plan: UpdatePlan,
        old: Sequence[torch.Tensor | None],
        refs: Sequence[torch.Tensor | None],
        sampled_log_probs: Sequence[np.ndarray] | None = None,
        *,
        last: bool = True,
    ) -> EpochStep:
        """One optimizer step over ``plan``'s micro-batches, their gradients summed: the
        loss of each (``old``: its old log-probs, None: the forward's own, detached;
        ``refs``: the reference's), the entropy bonus, the clipped gradient, the step and the
        schedule's. The diagnostics only where ``last``."""
        config, bonus = self.config, self.entropy_bonus
        asynchronous = config.asynchronous and sampled_log_probs is not None
        tis = config.tis_cap is not None and sampled_log_probs is not None
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum, stats = 0.0, {}
        # The bonus's coefficient, one for every micro-batch of the step (as TRL's), and the
        # step's entropy, which its adaptive control moves on.
        coef, step_entropy = bonus.applied(), 0.0
        for j, rows in enumerate(plan.batches):
            # Dropout (off unless asked for) and checkpointing, each on its own; the backward
            # inside, as a recompute runs the forward again in the same mode.
            mode = training_forwards(
                self.model, dropout=config.keep_dropout, checkpointing=plan.checkpointed[j]
            )
            with mode:
                log_probs, entropy, mask = self._scored(
                    tokens, masks, rows, entropy=last or bonus.on
                )
                if j >= plan.real:  # a filler: its collectives, no gradient
                    (log_probs.sum() * 0.0).backward()
                    continue
                old_log_probs = old[j]
                if asynchronous:  # the ratio to the version that sampled
                    old_log_probs = at_policy_tokens(mask, [sampled_log_probs[i] for i in rows])
                elif old_log_probs is None:
                    old_log_probs = log_probs.detach()
                is_weights = None
                if tis:  # toward the engine that sampled
                    drawn = at_policy_tokens(mask, [sampled_log_probs[i] for i in rows])
                    is_weights, cut = truncated_is_weights(
                        old_log_probs, drawn, mask, config.tis_cap
                    )
                    _add(stats, tis_truncated=float(cut.sum()))
                adv = left_pad([advantages[i] for i in rows], 0.0, self.device, np.float32)[0]
                loss = grpo_loss(
                    log_probs, old_log_probs, mask, adv, config.clip_coef,
                    delta=config.delta, ref_log_probs=refs[j], beta=config.kl_loss_coef,
                    num_tokens=plan.num_tokens, max_length=config.max_response_tokens,
                    is_weights=is_weights, **self.loss_options,
                )  # fmt: skip
                # Each response weighs 1/n whatever its micro-batch (dapo, cispo, vespo: each
                # token 1/num_tokens, so the micro-batches add up to the batch's loss): the
                # same loss and gradient for any split.
                if config.loss_type not in ("dapo", "cispo", "vespo"):
                    loss = loss * (len(rows) / plan.responses)
                if bonus.on:  # the batch's mean entropy, this micro-batch's share
                    summed = entropy[mask].sum()
                    step_entropy += float(summed.detach())
                    loss = loss - coef * summed / max(plan.num_tokens, 1)
                loss.backward()
                loss_sum += loss.item()
                if last:
                    _add(stats, entropy=float(entropy[mask].sum()), **update_stats(
                        log_probs, old_log_probs, mask, adv, config.clip_coef,
                        delta=config.delta, ref_log_probs=refs[j], **self.loss_options,
                    ))  # fmt: skip
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), config.max_grad_norm)
        grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        learning_rate = self.optimizer.param_groups[0]["lr"]  # this step's
        self.optimizer.step()
        self.scheduler.step()
        self.stepped = True
        if bonus.on and plan.num_tokens:  # no token in the loss: no entropy to move it by
            if self.sharded:
                step_entropy = all_reduce([step_entropy], device=self.device)[0]
            bonus.step(step_entropy / plan.num_tokens)
        return EpochStep(loss_sum, stats, grad_norm, learning_rate)

    def _row(self, step: EpochStep, tis: bool) -> dict[str, Any]:
        # The metrics row's part: the last epoch's loss and diagnostics, per token seen.
        total, stats = step.loss, step.stats
        if self.sharded:  # the whole batch's sums
            keys = ("clip_low", "clip_high", "approx_kl", "entropy", "tokens", "tis_truncated",
                    "reference_kl")  # fmt: skip
            summed = all_reduce([total, *(stats.get(k, 0.0) for k in keys)], device=self.device)
            total, stats = summed[0], dict(zip(keys, summed[1:], strict=True))
        tokens_seen = max(stats.get("tokens", 0.0), 1.0)
        row = {
            "loss": total,
            "clip_fraction": (stats["clip_low"] + stats["clip_high"]) / tokens_seen,
            "clip_fraction_low": stats["clip_low"] / tokens_seen,
            "clip_fraction_high": stats["clip_high"] / tokens_seen,
            "approx_kl": stats["approx_kl"] / tokens_seen,
            "entropy": stats["entropy"] / tokens_seen,
            "grad_norm": step.grad_norm,
            "learning_rate": step.learning_rate,
        }
        if self.config.kl_loss_coef > 0:  # the k3 KL to the reference the loss charged
            row["reference_kl"] = stats.get("reference_kl", 0.0) / tokens_seen
        if self.entropy_bonus.on:  # the coefficient the next step starts from, as TRL logs it
            row["entropy_coef"] = self.entropy_bonus.coef
        if tis:
            row["tis_truncated"] = stats.get("tis_truncated", 0.0) / tokens_seen
        row["trained_tokens"] = int(stats.get("tokens", 0.0))
        if not row["trained_tokens"]:  # nothing in the loss (--mask-truncated cut them all)
            diagnostics = ("loss", "clip_fraction", "clip_fraction_low", "clip_fraction_high",
                           "approx_kl", "entropy", "reference_kl", "tis_truncated")  # fmt: skip
            row.update({key: None for key in diagnostics if key in row})
        return row

    def _padded(
        self, tokens: Sequence[np.ndarray], masks: Sequence[np.ndarray], rows: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Any]:
        # The left-padded layout the loss reads, and the packed row the model runs on.
        ids, attention = left_pad([tokens[i] for i in rows], self.pad_id, self.device)
        selected = left_pad([masks[i] for i in rows], False, self.device)[0].bool()
        packed = pack([tokens[i] for i in rows], self.device) if self.packing else None
        return ids, attention, selected & has_prefix(attention), packed

    def _scored(
        self,
        tokens: Sequence[np.ndarray],
        masks: Sequence[np.ndarray],
        rows: list[int],
        entropy: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        # (log-probs, the entropy where asked for else None, the scored positions); the
        # entropy with its gradient where the loss carries the bonus.
        ids, attention, selected, packed = self._padded(tokens, masks, rows)
        grad = entropy and self.entropy_bonus.on and torch.is_grad_enabled()
        with self.autocast():
            out = self._log_probs(
                self.model, ids, attention, selected, entropy=entropy, entropy_grad=grad,
                packed=packed,
            )  # fmt: skip
        return (*out, selected) if entropy else (out, None, selected)

    def state_dict(self) -> dict[str, Any]:
        """What a resumed update goes on from besides the optimizer and the schedule: the
        entropy bonus's adaptive coefficient."""
        return {"entropy_bonus": self.entropy_bonus.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go on from ``state_dict()``'s state."""
        self.entropy_bonus.load_state_dict(state["entropy_bonus"])

    def _heavy(self, tokens: int) -> bool:
        # The CPU's rule: a micro-batch whose activations (estimated from the model's shape)
        # would outweigh the model's weights is checkpointed, so that an update's peak stays
        # within a few times the weights (weights, gradients, AdamW's moments, activations):
        # 2048 tokens of the default model's are 3.6 GB against its 0.54 GB of weights.
        config = getattr(unwrapped(self.model), "config", None)
        weights = list(self.model.parameters())
        size = 4 if weights[0].dtype == torch.float32 else 2
        need = activation_bytes(config.to_dict() if config is not None else {}, tokens, size)
        return need is not None and need > sum(p.numel() * p.element_size() for p in weights)

    def _short_of_memory(self, tokens: int) -> bool:
        # The micro-batch's activations (estimated from the model's shape) against the
        # device's free memory, less what the backward and the step still allocate: the
        # gradients and, before the first step, AdamW's moments (and masters).
        config = getattr(unwrapped(self.model), "config", None)
        weights = next(self.model.parameters()).dtype
        shape = config.to_dict() if config is not None else {}
        need = activation_bytes(shape, tokens, 4 if weights == torch.float32 else 2)
        free = available_memory(self.device)
        if need is None or free is None:
            return True  # nothing to tell by: the safe side
        if self.device.type == "cuda":  # what torch holds cached is free to it too
            free += torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(
                self.device
            )
        trained = [p for p in self.model.parameters() if p.requires_grad]
        pending = sum(p.numel() * p.element_size() for p in trained)  # the gradients
        if not self.stepped:
            state = 12 if weights != torch.float32 else 8  # moments; masters below float32
            pending += state * sum(p.numel() for p in trained)
        return need > 0.9 * (free - pending)

    def _reference_log_probs(
        self, ids: torch.Tensor, attention: torch.Tensor, selected: torch.Tensor, packed: Any
    ) -> torch.Tensor:
        # The starting model's log-probs (--kl-loss-coef): with LoRA the model, its adapter off.
        lora = is_lora(self.model)
        off = self.model.disable_adapter() if lora else contextlib.nullcontext()
        model = self.model if lora else self.reference.model
        with torch.no_grad(), off, self.autocast():
            return self._log_probs(model, ids, attention, selected, packed=packed)

    def _log_probs(self, model: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        # selected_log_probs; on a sharded model its root's forward method of that name
        # (llm_gym.train.sharding.shard_model), which gathers the root's weights for it.
        if self.sharded and model is self.model:
            return model.selected_log_probs(*args, **kwargs)
        return selected_log_probs(model, *args, **kwargs)


def _add(totals: dict[str, float], **values: float) -> None:
    for key, value in values.items():
        totals[key] = totals.get(key, 0.0) + value
