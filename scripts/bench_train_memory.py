"""Peak memory and seconds of ONE GRPO update (forward + backward + AdamW step) on a fixed
batch, several ways side by side (GPUs, precisions, LoRA, packing, ragged batches, tokens per
second and MFU, sharded with FSDP2):

- ``whole-logits``: the update over the whole logits, as a baseline:
  ``TransformersPolicy.get_dist`` over minibatches of 8 sequences (the whole ``(B, T, V)``
  logits), ``dist.log_prob(ids)``, ``grpo_loss``, ``(loss * rows / n).backward()``, no
  activation checkpointing, the model in eval mode; always float32 weights (``--precision``
  does not apply), on ``--device``.
- ``new``: llm_gym's trainer's update, ``GRPOTrainer.update`` of a trainer built from
  ``GRPOConfig(model=<--model>, device=<--device>, precision=<--precision>, ...)``:
  micro-batches by ``max_tokens_per_microbatch`` (4096), each packed into one row without
  padding (``packing=True``, GRPOConfig's default), activation checkpointing as GRPOConfig
  decides by default (for micro-batches of ``CHECKPOINT_TOKENS`` tokens, or half the budget
  if less, or more), ``selected_log_probs`` (the taken tokens' log-probs through the output
  layer in chunks). Its variants, written ``new[-<budget>][-ckpt|-nockpt][-lora<rank>]
  [-nopack][-fsdp2][@<precision>]`` in this order: ``new-2048``, ``new-8192``: that token
  budget; ``-ckpt`` / ``-nockpt``: checkpointing forced on / off; ``-lora16``: LoRA adapters
  of rank 16 (``lora_rank=16``, the base weights frozen); ``-nopack``: ``packing=False``, each
  micro-batch left-padded to its longest sequence (no packing); ``-fsdp2``:
  sharded (below); ``@fp32``, ``@bf16-mixed``, ``@bf16``: that precision instead of
  ``--precision``, e.g. ``new@bf16-mixed``, ``new-lora16@bf16``.
- ``new...-fsdp2`` (e.g. ``new-fsdp2``, ``new-lora16-fsdp2@bf16-mixed``): the same update
  sharded with FSDP2 over ``--nproc-per-node`` P processes, which ``torch.distributed.run
  --standalone`` starts (the default process group: gloo on the CPU; NCCL on CUDA, one GPU a
  process, ``cuda:<LOCAL_RANK>``). Each process builds the update itself (one update, not a
  training run) with the ``new`` case's ``GRPOConfig``: the model loaded whole as the trainer
  loads it (the precision's weights; LoRA's adapters drawn after ``torch.manual_seed(seed)``;
  checkpointing enabled unless forced off), then ``llm_gym.train.sharding.shard_model(model)``
  (``fully_shard`` on each decoder layer and the root), ``adamw`` over what
  trains and ``GRPOUpdate(model, optimizer, config, pad_id)`` called on the process's rows of
  the batch, ``[rank·n/P, (rank+1)·n/P)`` (``--sequences`` n must divide by P). Each process
  measures itself as a case's process does (below), every one starting each update together (a
  barrier); rank 0 gathers their numbers (``all_gather_object``), and the table has a row per
  process, ``new-fsdp2/r0``, ``new-fsdp2/r1``, ...: its peak, its seconds, its tokens (its
  rows'), the gradient norm (the whole batch's, gathered: it equals the one process's). With
  ``--nproc-per-node`` past 1 each ``new`` case in ``--cases`` is followed by its ``-fsdp2``
  variant; a ``-fsdp2`` case named without it is an error. Under torchrun each process runs
  one torch thread unless ``--threads`` or ``OMP_NUM_THREADS`` says otherwise.
- ``floor`` (computed, not measured): fp32 weights + gradients + AdamW's two moments, 4 ×
  params × 4 bytes, plus the checkpointed activations of one micro-batch, num_hidden_layers ×
  its tokens (the largest micro-batch's, without padding) × hidden_size × 4 bytes. A float32
  floor: it bounds the fp32 ``new`` cases, not LoRA's.
- ``trl``: TRL's ``GRPOTrainer`` (its defaults: ``loss_type="dapo"``, its fused LM head; with
  ``gradient_checkpointing=True``, ``bf16=False``) on the same batch, without generating: its
  ``compute_loss(model, inputs)`` on ``inputs`` in the format ``_generate_and_score_completions``
  returns (prompts left-padded, completions right-padded), ``accelerator.backward``,
  ``clip_grad_norm_`` to ``max_grad_norm`` and the optimizer of ``trainer.create_optimizer()``
  (AdamW, fused: transformers' default ``optim``), as ``Trainer.train`` would for one step
  with ``per_device_train_batch_size`` = the batch; the same ``--model`` (float32 weights).
  ``trl-<rows>`` (e.g. ``trl-4``): ``rows`` sequences a forward and gradient accumulation over
  the batch, as ``_prepare_inputs`` slices a generation batch (still one optimizer step).
  ``-bf16`` (``trl-bf16``, ``trl-4-bf16``): with ``bf16=True``, TRL's mixed precision (float32
  weights and optimizer, its forwards under bfloat16 autocast: ``accelerator.autocast()``).
  ``--precision`` does not apply to TRL's cases.

The model, ``--model``: ``default`` (SmolLM2-135M-Instruct, ``load_default_model``), a model
folder (``save_pretrained``'s), or the name of a shape, built with random weights (drawn on
``--device`` from ``--seed``; no download): ``SmolLM2-135M`` (hidden 576, 30 layers, 9 heads,
3 kv heads, intermediate 1536), ``SmolLM2-360M`` (960, 32, 15, 5, 2560) or ``SmolLM2-1.7B``
(2048, 24, 32, 32, 8192), each a ``LlamaConfig`` with vocabulary 49152, tied embeddings, 8192
positions and SmolLM2's rope_theta (1e5; 1.3e5 for 1.7B). The random model is saved in
float32 with the default model's tokenizer (the SmolLM2 family shares it) into a temporary
folder, which every case loads (``new``'s ``model=`` and TRL's).

The batch: ``--sequences`` (16) sequences of ``--seq-len`` (700) tokens, ``--prompt-len`` (100)
prompt + the rest response; or, with ``--lengths LOW-HIGH`` (e.g. ``50-700``), a ragged batch:
each sequence's length drawn uniformly from LOW to HIGH (both included) from ``--seed``, its
prompt ``min(--prompt-len, length // 2)`` tokens. Random token ids within the vocabulary from
``--seed``; advantages alternate +1, -1. Learning rate 5e-5, gradient clipping at 1.0, clip
coefficient 0.2. ``--device`` (``cpu``, ``cuda``) and ``--precision`` (``fp32``,
``bf16-mixed``: float32 weights and optimizer, forward and backward under bfloat16 autocast;
``bf16``: bfloat16 weights, float32 master copies in the optimizer) as GRPOConfig takes them.

Each case runs in its own Python process, so that its peak is its alone: the model and
optimizer are set up first (timed apart: ``setup s``), then the update is timed (``update s``).
On the CPU: every weight is read once (they load memory-mapped, and would otherwise become
resident only during the update), the RSS is read, then exactly one update is timed (it takes
minutes); ``peak GB`` is the process's peak RSS (``ru_maxrss``) and ``own GB`` the peak RSS
minus the RSS before the update: what the update itself adds (gradients and AdamW's moments
included, as they are allocated by the first update). On CUDA: after
setup ``torch.cuda.reset_peak_memory_stats()``, then three updates (``--updates``), each
between ``torch.cuda.synchronize()`` calls; ``peak GB`` is ``torch.cuda.max_memory_allocated()``
over them, ``before`` the memory allocated after setup, and ``update s`` the median of updates
2 and 3 (the first pays for CUDA's and the kernels' warm-up). The loss and the gradient norm
before clipping (what ``clip_grad_norm_`` returns) are the first update's in every case: equal
norms say the implementations compute the same gradient; at ratio 1 the loss value itself is
``-mean(advantages)`` (0 here) for llm_gym.

Throughput, for every case: ``tok/s``, the batch's real tokens (prompt + response, no padding;
a sharded case's row: its process's rows', so that its MFU is its device's) over ``update
s``; ``MFU``, the model-FLOPs utilisation: 6 × N × those tokens / ``update s`` /
the peak, where N counts all the model's parameters (embeddings included, the tied input and
output embedding once, as transformers' ``num_parameters()`` counts them; in the LoRA cases the
base model's and the adapters', although their backward skips the frozen weights' gradients, so
their MFU overstates the work done), attention's own FLOPs and activation checkpointing's
recomputation not counted. The peak is ``--peak-tflops``, by default bfloat16's dense peak for
the CUDA device's name (``PEAK_TFLOPS``): 790 where it contains ``H200``, 989 where it
contains ``H100``; else (the CPU, other GPUs) there is none and MFU is ``n/a``. The same peak
for every precision (an fp32 case's MFU is against bfloat16's peak too).

Run (offline; 15-30 minutes on 2 shared cores; ``whole-logits`` peaks near 16 GB, ``trl`` near 8)::

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/bench_train_memory.py
    .venv/bin/python scripts/bench_train_memory.py --cases new,new-2048-ckpt,trl --threads 1
    .venv/bin/python scripts/bench_train_memory.py --lengths 50-700 --cases new,new-nopack
    .venv/bin/python scripts/bench_train_memory.py --cases new --nproc-per-node 2 --threads 1
    python scripts/bench_train_memory.py --device cuda --model SmolLM2-1.7B \\
        --cases new,new@bf16-mixed,new-lora16,trl,trl-bf16 --json out.json

The goal for each sharded case against its one-process case (``new-fsdp2`` against
``new``): the largest process's peak at most 0.70x the one process's (the weights, gradients
and AdamW's moments divided among the processes; the activations of a micro-batch are not);
beside it the same ratio of ``own GB``, the slowest process's seconds over the one
process's, and the gradient norms' relative difference (at most 1e-4: a correctness check).
A line under the table prints each process's peak, seconds and gradient norm against the
one process's, and the batch's tokens per second (all the processes' tokens over the slowest
one's seconds).

``--json PATH`` writes every case's numbers (a sharded case's a row per process, with its
``rank``, ``world_size``, ``rows`` and ``sharded_case``) and the goals.
``scripts/gpu_check.sh`` runs it on a GPU (docs/training.md). On a CPU that other work
shares, ``--threads 1`` gives steadier seconds: with 2 threads a descheduled thread leaves
the other spinning, and wall and CPU time both grow with the load. RSS counts what glibc's
allocator keeps of freed tensors: the trainer (the ``new`` cases, sharded too: in
``GRPOUpdate``) sets its mmap threshold to 1 MiB around a large update on the CPU;
``MALLOC_MMAP_THRESHOLD_`` in the environment (the cases inherit it) sets it for every case,
TRL's too.

Last run (idle 2-core CPU, ``--cases new,new-2048,trl --threads 1``, torch 2.13,
transformers 5.24, TRL 1.16; peak GB, update s): new 2.84, 173 (floor 2.39: 1.19x; without
the interpreter's own RSS 1.09x); new-2048 2.84, 185; trl 8.15, 168 (new/TRL: 0.35x the
peak, 1.03x the time). The trainer lowers glibc's mmap threshold around a large update on
CPU (``set_host_mmap_threshold``); with glibc's own threshold: new 3.83-4.20, 136-140;
new-2048 (not checkpointed) 4.72, 120; whole-logits 16.27, 139; trl-4 6.47, 158.

Ragged, packed against padded (the idle 2-core CPU, ``--lengths 50-700 --sequences 16
--cases new,new-nopack --threads 2``: 5865 real tokens; the padded update's micro-batches
compute 7148): new 3.04 GB, 103.2 s, 57 tokens/s (forwards 8p+7pc+1p); new-nopack 4.08 GB,
116.1 s, 51 tokens/s (8+6c+2); packing 1.12x the tokens per second (the goal, 1.3x,
not met here: the padded micro-batches, sorted by length, hold only 1.22x the real tokens, and
the packed update's checkpointed micro-batch holds one sequence more) at 0.74x the peak. With
one thread on a CPU shared with other work: 34 and 29 tokens/s, 1.15x.

Sharded with FSDP2 over two processes (the 2-core CPU, shared with a test suite, ``--cases new
--nproc-per-node 2 --threads 1``, gloo, torch 2.13; peak GB, own GB, update s): new 2.78,
1.79, 361; new-fsdp2/r0 (sequences 0-7) 1.55, 0.88, 347; new-fsdp2/r1 (8-15) 1.54, 0.88,
347. Each process's peak 0.56x the one process's (the goal: at most 0.70x), its own GB 0.49x
(the weights, gradients and AdamW's moments halved; not the activations: each process's
largest micro-batch, checkpointed, holds 5 × 700 tokens as the one process's does); 0.96x the
seconds on twice the cores (each process 197-200 s of CPU against 351). Gradient norm before
clipping 12.64422 on both processes against 12.64347 (6.0e-5 relative). Forwards: 5pc+3pc a
process against 5pc+5pc+5pc+1p.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, NamedTuple

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch

CASES = ("whole-logits", "new", "new-2048", "new-8192", "trl")
# new[-<budget>][-ckpt|-nockpt][-lora<rank>][-nopack][-fsdp2][@<precision>]: the trainer's
# update with that token budget (default 4096), activation checkpointing as GRPOConfig decides by
# default or forced on or off, LoRA adapters, without packing, sharded with FSDP2 over
# --nproc-per-node processes, in another precision than --precision.
CHECKPOINTING = {"ckpt": True, "nockpt": False}
PRECISIONS = ("fp32", "bf16-mixed", "bf16")
LEARNING_RATE, MAX_GRAD_NORM, CLIP_COEF, MINIBATCH = 5e-5, 1.0, 0.2, 8
DEFAULT_BUDGET = 4096  # GRPOConfig.max_tokens_per_microbatch's default
GB = 1e9
# Random-weight models of SmolLM2's shapes (their config.json's), for --model.
SHAPES = {
    "SmolLM2-135M": {
        "hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9,
        "num_key_value_heads": 3, "intermediate_size": 1536, "rope_theta": 100000.0,
    },
    "SmolLM2-360M": {
        "hidden_size": 960, "num_hidden_layers": 32, "num_attention_heads": 15,
        "num_key_value_heads": 5, "intermediate_size": 2560, "rope_theta": 100000.0,
    },
    "SmolLM2-1.7B": {
        "hidden_size": 2048, "num_hidden_layers": 24, "num_attention_heads": 32,
        "num_key_value_heads": 32, "intermediate_size": 8192, "rope_theta": 130000.0,
    },
}  # fmt: skip
SHAPE_COMMON = {
    "vocab_size": 49152, "tie_word_embeddings": True, "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2,
}  # fmt: skip
# bfloat16's dense peak TFLOP/s by CUDA device name (--peak-tflops overrides it).
PEAK_TFLOPS = {"H200": 790.0, "H100": 989.0}
CUDA_UPDATES = 3  # on CUDA: three updates, the median of the 2nd and 3rd counts


class NewCase(NamedTuple):
    budget: int
    checkpointing: bool | None  # None: as GRPOConfig decides
    lora: int  # LoRA's rank; 0: none
    packing: bool
    precision: str | None  # None: --precision
    sharded: bool = False  # FSDP2 over --nproc-per-node processes, each its rows of the batch


class TRLCase(NamedTuple):
    rows: int | None  # sequences a forward; None: the whole batch
    bf16: bool


def parse_new(case: str) -> NewCase | None:
    """``new[-<budget>][-ckpt|-nockpt][-lora<rank>][-nopack][-fsdp2][@<precision>]`` -> its
    settings; None otherwise."""
    name, at, precision = case.partition("@")
    if at and precision not in PRECISIONS:
        return None
    head, *rest = name.split("-")
    if head != "new":
        return None
    budget = int(rest.pop(0)) if rest and rest[0].isdigit() else DEFAULT_BUDGET
    checkpointing = CHECKPOINTING[rest.pop(0)] if rest and rest[0] in CHECKPOINTING else None
    lora = 0
    if rest and rest[0].startswith("lora") and rest[0][4:].isdigit():
        lora = int(rest.pop(0)[4:])
    packing = not (rest and rest[0] == "nopack")
    if not packing:
        rest.pop(0)
    sharded = bool(rest) and rest[0] == "fsdp2"
    if sharded:
        rest.pop(0)
    if rest or budget <= 0 or (lora == 0 and "-lora" in name):
        return None
    return NewCase(budget, checkpointing, lora, packing, precision or None, sharded)


def sharded_variant(case: str) -> str:
    """A ``new`` case's FSDP2 variant: ``new`` -> ``new-fsdp2``, ``new-lora16@bf16`` ->
    ``new-lora16-fsdp2@bf16``."""
    name, at, precision = case.partition("@")
    return f"{name}-fsdp2{at}{precision}"


def single_variant(case: str) -> str:
    """A sharded case's one-process counterpart: ``new-fsdp2@bf16`` -> ``new@bf16``."""
    name, at, precision = case.partition("@")
    return f"{name.removesuffix('-fsdp2')}{at}{precision}"


def parse_trl(case: str) -> TRLCase | None:
    """``trl[-<rows>][-bf16]`` -> (sequences per forward, None: the whole batch; bf16);
    None otherwise."""
    head, *rest = case.split("-")
    if head != "trl":
        return None
    rows = int(rest.pop(0)) if rest and rest[0].isdigit() else None
    bf16 = bool(rest) and rest[0] == "bf16"
    if bf16:
        rest.pop(0)
    if rest or rows == 0:
        return None
    return TRLCase(rows, bf16)


def known(case: str) -> bool:
    return case == "whole-logits" or parse_new(case) is not None or parse_trl(case) is not None


def label(case: str, precision: str, nproc: int = 1) -> str:
    """What ``case`` runs, in words (``precision``: --precision; ``nproc``: the processes a
    sharded case runs on)."""
    if case == "whole-logits":
        return "the whole logits (get_dist, minibatch 8), fp32"
    trl = parse_trl(case)
    if trl:
        rows = "the batch a forward" if trl.rows is None else f"{trl.rows} a forward, accumulated"
        return f"TRL GRPOTrainer (checkpointing), {rows}, {'bf16' if trl.bf16 else 'fp32'}"
    new = parse_new(case)
    parts = [
        f"llm_gym GRPOUpdate, FSDP2 over {nproc} processes, {new.budget} tokens a micro-batch"
        if new.sharded else f"llm_gym update, {new.budget} tokens a micro-batch"
    ]  # fmt: skip
    parts += (
        [] if new.checkpointing is None else ["ckpt forced" if new.checkpointing else "no ckpt"]
    )
    parts += [f"LoRA {new.lora}"] if new.lora else []
    parts += ["packed" if new.packing else "padded (packing=False)"]
    return ", ".join([*parts, new.precision or precision])


# -- the batch and the model -----------------------------------------------------------


def parse_lengths(text: str) -> tuple[int, int]:
    """``LOW-HIGH`` -> (LOW, HIGH), 2 <= LOW <= HIGH (every sequence needs a prompt token and
    a response token)."""
    low, sep, high = text.partition("-")
    if not sep or not low.isdigit() or not high.isdigit() or not 2 <= int(low) <= int(high):
        raise argparse.ArgumentTypeError(f"expected LOW-HIGH with 2 <= LOW <= HIGH, got {text!r}")
    return int(low), int(high)


def sequence_lengths(args: argparse.Namespace) -> list[int]:
    """Each sequence's length: ``--seq-len``, or drawn uniformly from ``--lengths``."""
    if args.lengths is None:
        return [args.seq_len] * args.sequences
    low, high = args.lengths
    rng = np.random.default_rng([args.seed, 1])  # apart from the token ids' stream
    return [int(n) for n in rng.integers(low, high + 1, size=args.sequences)]


def prompt_lengths(args: argparse.Namespace, lengths: list[int]) -> list[int]:
    return [min(args.prompt_len, n // 2) if args.lengths else args.prompt_len for n in lengths]


def make_batch(args: argparse.Namespace, vocab: int) -> tuple[list, list, torch.Tensor]:
    """The fixed batch: token ids, response masks, advantages (+1, -1, +1, ...)."""
    rng = np.random.default_rng(args.seed)
    lengths = sequence_lengths(args)
    tokens = [rng.integers(0, vocab, size=n) for n in lengths]
    masks = [np.arange(n) >= p for n, p in zip(lengths, prompt_lengths(args, lengths), strict=True)]
    advantages = torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(args.sequences)])
    return tokens, masks, advantages


def save_random_model(shape: str, folder: str, seed: int, device: str = "cpu") -> None:
    """A ``LlamaForCausalLM`` of ``shape`` (``SHAPES``) with random weights (``seed``; drawn
    on ``device``, where a GPU draws 1.7B of them in a second), in float32, and the default
    model's tokenizer, saved into ``folder``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from llm_gym.lm.loading import load_default_model

    _, tokenizer = load_default_model()
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(LlamaConfig(**SHAPES[shape], **SHAPE_COMMON))
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    del model
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()  # the cases run in processes of their own


# -- one case, in its own process -------------------------------------------------------


def rss_bytes() -> int:
    """The process's resident set size now."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


class Memory:
    """The memory a case is measured by: on CUDA the allocated bytes
    (``torch.cuda.memory_allocated``, its peak ``max_memory_allocated``), on the CPU the
    process's RSS (its peak ``ru_maxrss``); ``sync`` waits for the device's queued work."""

    def __init__(self, device: str) -> None:
        self.cuda = torch.device(device).type == "cuda"

    def now(self) -> int:
        return torch.cuda.memory_allocated() if self.cuda else rss_bytes()

    def peak(self) -> int:
        return torch.cuda.max_memory_allocated() if self.cuda else peak_rss_bytes()

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


def record_grad_norms() -> list[float]:
    """Every ``torch.nn.utils.clip_grad_norm_`` call's result (the norm before clipping) from
    now on; llm_gym's trainer looks the function up at each call, so it is recorded too."""
    norms: list[float] = []
    original = torch.nn.utils.clip_grad_norm_

    def recording(*a: Any, **k: Any) -> torch.Tensor:
        norm = original(*a, **k)  # sharded: a DTensor, whose whole value every process gathers
        norms.append(float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm))
        return norm

    torch.nn.utils.clip_grad_norm_ = recording
    return norms


def time_steps(optimizer: torch.optim.Optimizer, memory: Memory) -> list[tuple[float, int]]:
    """Each of ``optimizer``'s steps from now on: its wall seconds, and the peak memory as it
    began (the forwards' and backwards' peak)."""
    steps: list[tuple[float, int]] = []
    original = optimizer.step

    def step(*a: Any, **k: Any) -> Any:
        memory.sync()
        peak, start = memory.peak(), time.perf_counter()
        out = original(*a, **k)
        memory.sync()
        steps.append((time.perf_counter() - start, peak))
        return out

    optimizer.step = step
    return steps


def adamw_kind(optimizer: torch.optim.Optimizer) -> str:
    """How the AdamW runs: fused, foreach or the per-tensor loop (torch's CPU default)."""
    if optimizer.defaults.get("fused"):
        return "fused"
    return "foreach" if optimizer.defaults.get("foreach") else "loop"


def setup_whole_logits(args: argparse.Namespace, info: dict[str, Any]) -> Any:
    from llm_gym.lm.loading import load_model
    from llm_gym.policies import TransformersPolicy
    from llm_gym.train.loss import grpo_loss

    model, tokenizer = load_model(args.model, device=args.device)
    info["model"] = model
    scorer = TransformersPolicy(model, tokenizer, input_mode="tokens", generate=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    info["optimizer"] = optimizer
    tokens, masks, advantages = make_batch(args, model.config.vocab_size)
    advantages = advantages.to(args.device)
    n = len(tokens)
    batches = [range(i, min(i + MINIBATCH, n)) for i in range(0, n, MINIBATCH)]
    info["forwards"] = "+".join(str(len(rows)) for rows in batches)

    def update() -> float:  # one epoch over the minibatches
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for rows in batches:
            part = {"tokens": tuple(tokens[i] for i in rows)}
            dist, ids = scorer.get_dist(part, mask=[masks[i] for i in rows])
            log_probs = dist.log_prob(ids).float()
            adv = advantages[rows.start : rows.stop]
            loss = grpo_loss(log_probs, log_probs.detach(), dist.mask, adv, CLIP_COEF)
            (loss * len(rows) / n).backward()
            total += loss.item() * len(rows) / n
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
        optimizer.step()
        return total

    return update


def new_config(args: argparse.Namespace, info: dict[str, Any], case: NewCase) -> Any:
    """The ``GRPOConfig`` of a ``new`` case (its ``out`` a temporary folder)."""
    from llm_gym.train import GRPOConfig

    folder = tempfile.mkdtemp(prefix="bench_train_memory_")
    info["cleanup"].append(lambda: shutil.rmtree(folder, ignore_errors=True))
    info["precision"] = case.precision or args.precision
    config = GRPOConfig(
        model=args.model, device=args.device, precision=info["precision"],
        packing=case.packing, lora_rank=case.lora,
        out=str(Path(folder) / "run"), eval_episodes=0, progress=False,
        groups=max(1, args.sequences // 8), group_size=8, learning_rate=LEARNING_RATE,
        max_tokens_per_microbatch=case.budget, max_grad_norm=MAX_GRAD_NORM, clip_coef=CLIP_COEF,
        minibatch_size=MINIBATCH,
    )  # fmt: skip
    if case.checkpointing is not None:  # else GRPOConfig's default
        config.gradient_checkpointing = case.checkpointing
    return config


def record_forwards(model: torch.nn.Module) -> list[str]:
    """Each forward of the update from now on: its sequences, whether they ran packed into one
    row (``p``), and whether it ran checkpointed (``c``: its layers' forwards wrapped in the
    checkpoint, as ``training_forwards`` does)."""
    import llm_gym.train.update as update_module

    forwards: list[str] = []

    def note(module: torch.nn.Module, ids: torch.Tensor, packed: Any) -> None:
        wrapped = any("forward" in vars(m) for m in module.modules())
        checkpointed = "c" if wrapped else ""
        forwards.append(f"{ids.shape[0]}{'p' if packed is not None else ''}{checkpointed}")

    if hasattr(model, "selected_log_probs"):  # sharded: the root's FSDP forward method
        method = model.selected_log_probs

        def sharded(ids: torch.Tensor, *a: Any, **k: Any) -> torch.Tensor:
            note(model, ids, k.get("packed"))
            return method(ids, *a, **k)

        model.selected_log_probs = sharded
        return forwards
    scored = update_module.selected_log_probs

    def recording(module: torch.nn.Module, ids: torch.Tensor, *a: Any, **k: Any) -> torch.Tensor:
        note(module, ids, k.get("packed"))
        return scored(module, ids, *a, **k)

    update_module.selected_log_probs = recording
    return forwards


def setup_new(args: argparse.Namespace, info: dict[str, Any], case: NewCase) -> Any:
    from llm_gym.train import GRPOTrainer, per_token_advantages

    config = new_config(args, info, case)
    trainer = GRPOTrainer(config)
    info["cleanup"].insert(0, lambda: (trainer.close(), trainer.lock.release()))
    info["model"], info["optimizer"] = trainer.model, trainer.optimizer
    info["weights"] = str(next(trainer.model.parameters()).dtype).removeprefix("torch.")
    tokens, masks, advantages = make_batch(args, trainer.model.config.vocab_size)
    lengths = [len(t) for t in tokens]
    forwards = record_forwards(trainer.model)

    def update() -> float:
        forwards.clear()
        loss = trainer.update(tokens, masks, per_token_advantages(advantages, lengths))["loss"]
        info["forwards"] = "+".join(forwards)
        return loss

    return update


def setup_sharded(
    args: argparse.Namespace, info: dict[str, Any], case: NewCase, rows: range
) -> Any:
    """A ``-fsdp2`` case on this process (one of torchrun's): the model loaded as the trainer
    loads it (the precision's weights, its LoRA adapters from the config's seed, checkpointing
    enabled unless forced off), sharded (``shard_model``), ``adamw`` over what trains and
    ``GRPOUpdate`` with the ``new`` case's config, on this process's ``rows`` of the batch:
    one update, without the trainer around it."""
    from llm_gym.lm.loading import load_model
    from llm_gym.lm.lora import unwrapped, with_lora
    from llm_gym.train import per_token_advantages
    from llm_gym.train.optim import adamw
    from llm_gym.train.sharding import shard_model
    from llm_gym.train.update import PRECISION_WEIGHTS, GRPOUpdate

    config = new_config(args, info, case)
    device = torch.device(args.device)
    if device.type == "cuda":  # one GPU a process
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.manual_seed(config.seed)  # as the trainer, before LoRA draws its adapters
    model, tokenizer = load_model(
        args.model, device=device, dtype=PRECISION_WEIGHTS[info["precision"]]
    )
    if case.lora:
        model = with_lora(
            model, case.lora, alpha=config.lora_alpha, dropout=config.lora_dropout,
            target_modules=config.lora_target_modules,
        )  # fmt: skip
    if config.gradient_checkpointing is not False:  # as GRPOTrainer enables it
        base = unwrapped(model)
        enable = getattr(base, "activation_checkpointing_enable", None)
        (enable or base.gradient_checkpointing_enable)({"use_reentrant": False})
    shard_model(model)
    info["model"] = model
    info["weights"] = str(next(model.parameters()).dtype).removeprefix("torch.")
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = info["optimizer"] = adamw(trained, config.learning_rate)
    updater = GRPOUpdate(model, optimizer, config, tokenizer.pad_token_id)
    tokens, masks, advantages = make_batch(args, unwrapped(model).config.vocab_size)
    tokens, masks = [tokens[i] for i in rows], [masks[i] for i in rows]
    advantages = advantages[rows.start : rows.stop]  # on the CPU, as the trainer's
    spread = per_token_advantages(advantages, [len(t) for t in tokens])
    forwards = record_forwards(model)

    def update() -> float:
        forwards.clear()
        loss = updater(tokens, masks, spread)["loss"]  # the whole batch's (summed)
        info["forwards"] = "+".join(forwards)
        return loss

    return update


def setup_trl(args: argparse.Namespace, info: dict[str, Any], case: TRLCase) -> Any:
    import trl
    from datasets import Dataset
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer as TRLTrainer
    from trl.trainer.utils import split_tensor_dict

    from llm_gym.lm.loading import load_model

    info["trl_version"] = trl.__version__
    model, tokenizer = load_model(args.model)  # float32, on the CPU: TRL's Trainer moves it
    info["model"] = model
    folder = tempfile.mkdtemp(prefix="bench_train_memory_trl_")
    info["cleanup"].append(lambda: shutil.rmtree(folder, ignore_errors=True))
    tokens, masks, advantages = make_batch(args, model.config.vocab_size)
    lengths = [len(t) for t in tokens]
    prompts = prompt_lengths(args, lengths)
    n, response = args.sequences, max(a - b for a, b in zip(lengths, prompts, strict=True))
    rows = case.rows or n  # per forward; the rest of the batch by gradient accumulation
    if n % rows:
        raise ValueError(f"trl-{rows}: {n} sequences do not split into forwards of {rows}")
    accumulated = n // rows
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # gradient_checkpointing's new name
        config = TRLConfig(
            output_dir=folder, use_cpu=torch.device(args.device).type == "cpu", bf16=case.bf16,
            report_to="none",
            per_device_train_batch_size=rows, gradient_accumulation_steps=accumulated,
            num_generations=8,
            max_completion_length=response, gradient_checkpointing=True,
            learning_rate=LEARNING_RATE, max_grad_norm=MAX_GRAD_NORM, epsilon=CLIP_COEF,
            save_strategy="no", logging_steps=1, disable_tqdm=True,
        )  # fmt: skip

    def zero_reward(completions: list[Any], **kwargs: Any) -> list[float]:
        return [0.0] * len(completions)

    dataset = Dataset.from_dict({"prompt": ["Say something."] * n})
    trainer = TRLTrainer(
        model=model, reward_funcs=zero_reward, args=config, train_dataset=dataset,
        processing_class=tokenizer,
    )  # fmt: skip
    info["loss_type"] = trainer.loss_type
    info["precision"] = "bf16 autocast" if case.bf16 else "fp32"
    model = trainer.model
    # What Trainer.train() does before its loop (transformers 5): checkpointing on.
    if config.activation_checkpointing:
        kwargs = dict(config.activation_checkpointing_kwargs or {})
        every, offload = kwargs.pop("every_n_layers", 1), kwargs.pop("offload", False)
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs=kwargs or None, every_n_layers=every, offload=offload
        )
    info["checkpointing"] = any(
        getattr(m, "gradient_checkpointing", False) for m in model.modules()
    )
    optimizer = info["optimizer"] = trainer.create_optimizer()
    trainer.current_gradient_accumulation_steps = accumulated  # set by Trainer's loop
    # As _generate_and_score_completions pads them: prompts on the left, completions on the
    # right (a uniform batch has no padding).
    pad, width = tokenizer.pad_token_id, max(prompts)
    prompt = torch.full((n, width), pad, dtype=torch.long)
    prompt_mask = torch.zeros((n, width), dtype=torch.long)
    completion = torch.full((n, response), pad, dtype=torch.long)
    completion_mask = torch.zeros((n, response), dtype=torch.long)
    for i, (ids, mask, p) in enumerate(zip(tokens, masks, prompts, strict=True)):
        ids = torch.from_numpy(ids)
        prompt[i, width - p :], prompt_mask[i, width - p :] = ids[:p], 1
        completion[i, : len(ids) - p] = ids[p:]
        completion_mask[i, : len(ids) - p] = torch.from_numpy(mask[p:]).long()
    device = trainer.accelerator.device
    # The keys _generate_and_score_completions returns with num_iterations 1, no vLLM, no
    # reference model (beta 0), text only: old_per_token_logps absent (None).
    inputs = {
        "prompt_ids": prompt.to(device),
        "prompt_mask": prompt_mask.to(device),
        "completion_ids": completion.to(device),
        "completion_mask": completion_mask.to(device),
        "advantages": advantages.to(device),
        "num_items_in_batch": completion_mask.sum().to(device),
    }
    # As _prepare_inputs buffers a generation batch: one slice per accumulation step, each
    # keeping the whole batch's num_items_in_batch (the dapo loss divides by it).
    slices = split_tensor_dict(inputs, accumulated)
    info["forwards"] = "+".join([f"{rows}{'c' if info['checkpointing'] else ''}"] * accumulated)

    def update() -> float:  # Trainer.training_step per slice, then its loop's clip and step
        model.train()
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for part in slices:
            with trainer.compute_loss_context_manager():
                loss = trainer.compute_loss(model, part)
            trainer.accelerator.backward(loss)
            total += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
        optimizer.step()
        return total

    return update


def run_one(case: str, args: argparse.Namespace, rank: int = 0, world: int = 1) -> dict[str, Any]:
    """Set ``case`` up, then time its update(s); its numbers. A sharded case: this process's,
    ``rank`` of ``world`` (its rows of the batch, its memory, its seconds)."""
    if args.threads:
        torch.set_num_threads(args.threads)
    memory = Memory(args.device)
    updates = args.updates or (CUDA_UPDATES if memory.cuda else 1)
    result: dict[str, Any] = {"case": case, "threads": torch.get_num_threads()}
    result["device"] = torch.cuda.get_device_name() if memory.cuda else "cpu"
    info: dict[str, Any] = {"cleanup": []}
    result["rss_start"] = rss_bytes()
    lengths = sequence_lengths(args)
    n = len(lengths)
    rows = range(rank * n // world, (rank + 1) * n // world)  # this process's
    lengths = [lengths[i] for i in rows]
    result["tokens"], result["padded_tokens"] = sum(lengths), len(lengths) * max(lengths)
    if world > 1:
        result.update(rank=rank, world_size=world, rows=[rows.start, rows.stop])
    start = time.perf_counter()
    try:
        if case == "whole-logits":
            update = setup_whole_logits(args, info)
        elif parse_new(case) and parse_new(case).sharded:
            update = setup_sharded(args, info, parse_new(case), rows)
        elif parse_new(case):
            update = setup_new(args, info, parse_new(case))
        elif parse_trl(case):
            update = setup_trl(args, info, parse_trl(case))
        else:
            raise ValueError(f"unknown case {case!r}")
        result["setup_s"] = time.perf_counter() - start
        model = info.pop("model")
        parameters = list(model.parameters())  # each tensor once: tied embeddings count once
        result["params"] = sum(p.numel() for p in parameters)  # sharded: the whole tensors'
        result["trainable"] = sum(p.numel() for p in parameters if p.requires_grad)
        result["layers"] = model.config.num_hidden_layers
        result["hidden"] = model.config.hidden_size
        result["attention"] = model.config._attn_implementation
        optimizer = info.pop("optimizer")
        result["adamw"] = f"{type(optimizer).__name__} {adamw_kind(optimizer)}"
        if memory.cuda:
            memory.sync()
            torch.cuda.reset_peak_memory_stats()
        else:
            # The weights are loaded memory-mapped: read each once, so that they are resident
            # before the update and the RSS after setup counts them.
            with torch.no_grad():
                for p in parameters:  # sharded: this process's shard
                    (p.to_local() if hasattr(p, "to_local") else p).sum()
        del parameters
        norms, steps = record_grad_norms(), time_steps(optimizer, memory)
        result["rss_before"], result["peak_before"] = memory.now(), memory.peak()
        walls, cpus, losses = [], [], []
        for _ in range(updates):
            memory.sync()
            if world > 1:  # every process starts its update together
                torch.distributed.barrier()
            start, cpu = time.perf_counter(), time.process_time()
            losses.append(update())
            memory.sync()
            walls.append(time.perf_counter() - start)
            cpus.append(time.process_time() - cpu)  # all threads
        timed = slice(1, None) if updates > 1 else slice(None)  # past the warm-up update
        result["updates"], result["update_walls"] = updates, walls
        result["update_s"] = statistics.median(walls[timed])
        result["update_cpu_s"] = statistics.median(cpus[timed])
        result["peak"], result["rss_after"] = memory.peak(), memory.now()
        result["host_peak"] = peak_rss_bytes()
        result["loss"], result["grad_norm"] = float(losses[0]), norms[0] if norms else None
        result["step_s"] = statistics.median([s for s, _ in steps][timed]) if steps else 0.0
        result["peak_before_step"] = steps[0][1] if steps else None
        result["tokens_per_s"] = result["tokens"] / result["update_s"]
        result["flops"] = 6 * result["params"] * result["tokens"]  # per update (MFU's)
    except Exception as error:  # the case cannot be built or run: say why, no numbers
        traceback.print_exc()
        result["error"] = f"{type(error).__name__}: {error}".splitlines()[0][:300]
    finally:
        for cleanup in info.pop("cleanup"):
            cleanup()
    result.update({k: v for k, v in info.items() if isinstance(v, str | int | float | bool)})
    return result


def run_rank(case: str, args: argparse.Namespace) -> dict[str, Any] | None:
    """A sharded case on this process, one of torchrun's (its environment: ``RANK``,
    ``WORLD_SIZE``, ``LOCAL_RANK``): the default group (gloo on the CPU, NCCL on CUDA, one
    GPU a process), ``run_one`` on its rows; rank 0 gathers every process's numbers (in rank
    order) and returns them, the others None."""
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if torch.device(args.device).type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if torch.device(args.device).type == "cuda" else "gloo")
    try:
        result = run_one(case, args, rank, world)
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, result)
    finally:
        dist.destroy_process_group()
    return {"case": case, "ranks": gathered} if rank == 0 else None


# -- the parent: one process per case, the table and the goals ---------------------------


def run_child(case: str, args: argparse.Namespace, model: str) -> dict[str, Any]:
    """``case`` in a process of its own (a sharded one: torchrun's ``--nproc-per-node``
    processes); its result."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    launch = [sys.executable]
    new = parse_new(case)
    if new and new.sharded:
        launch += [
            "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={args.nproc_per_node}",
        ]  # fmt: skip
    command = [
        *launch, __file__, "--one", case, "--seq-len", str(args.seq_len),
        "--prompt-len", str(args.prompt_len), "--sequences", str(args.sequences),
        "--seed", str(args.seed), "--threads", str(args.threads or 0),
        "--device", args.device, "--precision", args.precision, "--model", model,
        "--updates", str(args.updates), "--nproc-per-node", str(args.nproc_per_node),
    ]  # fmt: skip
    if args.lengths:
        command += ["--lengths", "-".join(map(str, args.lengths))]
    # In a session of its own: on a timeout torchrun's processes go with it.
    child = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = child.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, 9)
        child.communicate()
        return {"case": case, "error": f"no result within --timeout {args.timeout} s"}
    done = subprocess.CompletedProcess(command, child.returncode, stdout, stderr)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if lines:
        result = json.loads(lines[-1])
        if "error" in result:
            print("\n".join(done.stderr.strip().splitlines()[-12:]), file=sys.stderr)
        return result
    tail = done.stderr.strip().splitlines()[-12:]
    killed = " (killed: out of memory?)" if done.returncode in (-9, 137) else ""
    print("\n".join(tail), file=sys.stderr)
    return {"case": case, "error": f"exit {done.returncode}{killed}, no result"}


def per_rank(result: dict[str, Any]) -> list[dict[str, Any]]:
    """A case's rows: a sharded case's one a process, named ``<case>/r<rank>``."""
    if "ranks" not in result:
        return [result]
    return [
        {**r, "case": f"{result['case']}/r{r.get('rank', i)}", "sharded_case": result["case"]}
        for i, r in enumerate(result["ranks"])
    ]


def peak_tflops(args: argparse.Namespace, device: str) -> float | None:
    """The peak MFU is measured against: --peak-tflops, else by the device's name."""
    if args.peak_tflops:
        return args.peak_tflops
    return next((tflops for name, tflops in PEAK_TFLOPS.items() if name in device), None)


def add_mfu(result: dict[str, Any], args: argparse.Namespace) -> None:
    """``result``'s MFU (None: no peak known) and the peak it is of."""
    if "flops" not in result:
        return
    peak = result["peak_tflops"] = peak_tflops(args, result.get("device", ""))
    achieved = result["flops"] / result["update_s"]
    result["mfu"] = None if peak is None else achieved / (peak * 1e12)


def floor_bytes(result: dict[str, Any], args: argparse.Namespace, budget: int) -> dict:
    """The floor of a new-path update with ``budget``: its parts and how they are computed."""
    from llm_gym.train.loss import microbatches

    lengths = sequence_lengths(args)
    split = microbatches(lengths, budget, MINIBATCH, packed=True)
    tokens = max(sum(lengths[i] for i in rows) for rows in split)  # packed: no padding
    params, layers, hidden = result["params"], result["layers"], result["hidden"]
    state, activations = 4 * params * 4, layers * tokens * hidden * 4
    return {"state": state, "activations": activations, "total": state + activations,
            "tokens": tokens, "params": params, "layers": layers, "hidden": hidden}  # fmt: skip


def gb(value: float | None) -> str:
    return "-" if value is None else f"{value / GB:.2f}"


def print_table(
    results: list[dict[str, Any]], floors: dict[int, dict], args: argparse.Namespace
) -> None:
    width = max([len(r["case"]) for r in results] + [len("floor-4096"), 4])
    print(
        f"\n{'case':<{width}} {'peak GB':>7} {'fwd+bwd':>7} {'before':>6} {'own GB':>6} "
        f"{'update s':>8} {'cpu s':>7} {'step s':>6} {'setup s':>7} {'tok/s':>8} {'MFU':>6} "
        f"{'forwards':>9} {'loss':>9} {'grad norm':>9}"
    )
    for r in results:
        if "error" in r:
            print(f"{r['case']:<{width}} FAILED: {r['error']}")
            continue
        own = r["peak"] - r["rss_before"]
        mfu = "n/a" if r.get("mfu") is None else f"{100 * r['mfu']:.1f}%"
        print(
            f"{r['case']:<{width}} {gb(r['peak']):>7} {gb(r['peak_before_step']):>7} "
            f"{gb(r['rss_before']):>6} {gb(own):>6} {r['update_s']:8.2f} "
            f"{r['update_cpu_s']:7.1f} {r['step_s']:6.2f} {r['setup_s']:7.1f} "
            f"{r['tokens_per_s']:8.0f} {mfu:>6} {r.get('forwards', ''):>9} "
            f"{r['loss']:9.2e} {r['grad_norm']:9.4f}"
        )
        if r["peak"] <= r["peak_before"]:
            print(f"{'':<{width}} (the peak was reached before the update: setup's, not its)")
    for budget, floor in floors.items():
        print(f"{f'floor-{budget}':<{width}} {gb(floor['total']):>7}")
    cuda = any(r.get("device", "cpu") != "cpu" for r in results)
    updates = max((r.get("updates", 1) for r in results), default=1)
    print("\ncases:")
    for r in results:
        case = r.get("sharded_case", r["case"])
        rows = f"; rank {r['rank']}: rows {r['rows'][0]}-{r['rows'][1] - 1}" if "rows" in r else ""
        print(f"  {r['case']:<{width}} {label(case, args.precision, args.nproc_per_node)}{rows}")
    for budget in floors:
        name = f"floor-{budget}"
        print(f"  {name:<{width}} computed: fp32 weights, gradients, AdamW; one micro-batch's")
    if cuda:
        print(
            "\n(GB = 10^9 bytes; peak: torch.cuda.max_memory_allocated over the updates; fwd+bwd:"
        )
        print(" the same as the first optimizer step began; before: allocated after setup; own:")
        print(f" peak - before; update s: median wall clock of updates 2-{updates} (synchronized);")
    else:
        print("\n(GB = 10^9 bytes; peak: the process's peak RSS; fwd+bwd: the peak RSS as the")
        print(" optimizer's step began; before: RSS after setup (weights resident), before the")
        print(" update; own: peak - before, what the update adds (gradients and AdamW's moments")
        print(" included); update s: wall clock;")
    print(" cpu s: the process's CPU time, all threads; step s: of which the optimizer's step;")
    print(" tok/s: real (non-padding) tokens / update s; MFU: 6 x params x tokens / update s /")
    print(" peak (n/a: no peak known); forwards: sequences per forward, p: packed into one")
    print(" row, c: checkpointed;")
    print(" grad norm: before clipping, as clip_grad_norm_ returns it; loss, grad norm: update 1)")
    kinds = {r["case"]: r["adamw"] for r in results if "adamw" in r}
    print("optimizers: " + "; ".join(f"{case} {kind}" for case, kind in kinds.items()))
    peaks = {r.get("peak_tflops") for r in results if "mfu" in r} - {None}
    devices = {r["device"] for r in results if "device" in r}
    print(f"device: {', '.join(sorted(devices))}; MFU's peak: "
          f"{', '.join(f'{p:g} TFLOP/s' for p in sorted(peaks)) or 'none'}")  # fmt: skip


def print_floor(floor: dict, budget: int) -> None:
    print(
        f"\nfloor at --max-tokens-per-microbatch {budget}: weights + gradients + AdamW's two "
        f"moments, 4 × {floor['params']:,} params × 4 bytes = {gb(floor['state'])} GB; plus the "
        f"checkpointed activations of one micro-batch, {floor['layers']} layers × "
        f"{floor['tokens']} tokens × {floor['hidden']} hidden × 4 bytes = "
        f"{gb(floor['activations'])} GB; total {gb(floor['total'])} GB"
    )


Goal = tuple[str, float | None, str, bool | None, str]  # name, value, target, met, note
GOAL_KEYS = ("goal", "value", "target", "met", "note")


def goals(by_case: dict[str, dict], floors: dict[int, dict], args: argparse.Namespace) -> list:
    """The goals: the ``new`` update's peak and seconds against the floor, TRL and the
    whole-logits baseline (the default model, fp32, on the CPU); each sharded case's
    (``sharded_goals``); packing's tokens per second against padding's."""

    def ok(r: dict | None) -> bool:
        return r is not None and "error" not in r

    new, whole = by_case.get("new"), by_case.get("whole-logits")
    trls = {case: r for case, r in by_case.items() if parse_trl(case)}
    rows: list[Goal] = []
    default_cpu = args.device == "cpu" and args.model == "default" and args.precision == "fp32"
    if default_cpu and ok(new):
        peak = new["peak"] / GB
        rows.append(("new peak (GB)", peak, "<= 4.00", peak <= 4.0, ""))
        if DEFAULT_BUDGET in floors:
            ratio = new["peak"] / floors[DEFAULT_BUDGET]["total"]
            rows.append(("new peak / floor", ratio, "<= 1.50", ratio <= 1.5, ""))
            # The floor counts tensors; the RSS also holds torch's own code and buffers (the
            # process's RSS before anything is set up), which no update can shed.
            ratio = (new["peak"] - new["rss_start"]) / floors[DEFAULT_BUDGET]["total"]
            rows.append(("new (peak - runtime) / floor", ratio, "<= 1.50", ratio <= 1.5, ""))
        for case, trl in trls.items():
            name = "TRL" if case == "trl" else case
            if not ok(trl):
                rows.append((f"new vs {name}", None, "", None, f"failed: {trl['error']}"))
                continue
            ratio = new["peak"] / trl["peak"]
            rows.append((f"new peak / {name} peak", ratio, "< 1.00", ratio < 1.0, ""))
            for clock, key in (("wall", "update_s"), ("CPU time", "update_cpu_s")):
                ratio = new[key] / trl[key]
                rows.append((f"new s / {name} s ({clock})", ratio, "<= 1.30", ratio <= 1.3, ""))
        if not trls:
            rows.append(("new vs TRL", None, "", None, "no TRL case run"))
        if ok(whole):
            rows.append(("whole-logits peak / new peak", whole["peak"] / new["peak"], "", None,
                         ""))  # fmt: skip
            for clock, key in (("wall", "update_s"), ("CPU time", "update_cpu_s")):
                ratio = whole[key] / new[key]
                rows.append((f"whole-logits s / new s ({clock})", ratio, "", None, ""))
            own = (whole["peak"] - whole["rss_before"]) / (new["peak"] - new["rss_before"])
            rows.append(("whole-logits own GB / new own GB", own, "", None, ""))
    elif default_cpu:
        rows.append(("new path", None, "", None, "missing or failed: no goals to check"))
    rows += sharded_goals(by_case)
    # Packing: >= 1.3x the padded update's tokens per second on a ragged batch.
    for case, padded in by_case.items():
        parsed = parse_new(case)
        if parsed is None or parsed.packing:
            continue
        packed_case = case.replace("-nopack", "")
        packed = by_case.get(packed_case)
        name = f"{packed_case} tok/s / {case} tok/s"
        if not (ok(packed) and ok(padded)):
            rows.append((name, None, ">= 1.30", None, "a case missing or failed"))
            continue
        ratio = packed["tokens_per_s"] / padded["tokens_per_s"]
        note = "" if args.lengths else "(a uniform batch has no padding to save)"
        rows.append((name, ratio, ">= 1.30", ratio >= 1.3 if args.lengths else None, note))
    return rows


def sharded_ranks(by_case: dict[str, dict]) -> dict[str, list[dict]]:
    """Each sharded case's rows, one a process, in rank order."""
    ranks: dict[str, list[dict]] = {}
    for r in by_case.values():
        if "sharded_case" in r:
            ranks.setdefault(r["sharded_case"], []).append(r)
    return ranks


def sharded_goals(by_case: dict[str, dict]) -> list[Goal]:
    """The sharded cases' goal: each process's peak at most 0.7x the one process's on the
    whole batch (its weights, gradients and AdamW's moments divided among the processes); the
    RSS's or the allocator's own part (peak - before) beside it, and the gradient norms'
    agreement."""
    rows: list[Goal] = []
    for case, ranks in sharded_ranks(by_case).items():
        base = single_variant(case)
        single = by_case.get(base)
        name = f"{case} max rank peak / {base} peak"
        failed = [r for r in ranks if "error" in r]
        if single is None or "error" in single or failed:
            rows.append((name, None, "<= 0.70", None, "a case missing or failed"))
            continue
        ratio = max(r["peak"] for r in ranks) / single["peak"]
        rows.append((name, ratio, "<= 0.70", ratio <= 0.7, ""))
        own = max(r["peak"] - r["rss_before"] for r in ranks)
        own_single = single["peak"] - single["rss_before"]
        rows.append((f"{case} max rank own GB / {base} own GB", own / own_single, "", None, ""))
        slowest = max(r["update_s"] for r in ranks)
        rows.append((f"{case} update s (slowest rank) / {base} s", slowest / single["update_s"],
                     "", None, ""))  # fmt: skip
        norms = {r["grad_norm"] for r in ranks}
        if single["grad_norm"] and None not in norms:
            worst = max(abs(x - single["grad_norm"]) / single["grad_norm"] for x in norms)
            rows.append((f"{case} grad norm vs {base}'s (relative)", worst, "<= 1e-4",
                         worst <= 1e-4, ""))  # fmt: skip
    return rows


def print_sharded(by_case: dict[str, dict]) -> None:
    """Each sharded case against its one process: peaks, seconds, gradient norms."""
    for case, ranks in sharded_ranks(by_case).items():
        single = by_case.get(single_variant(case))
        if single is None or "error" in single or any("error" in r for r in ranks):
            continue
        peaks = ", ".join(f"r{r['rank']} {gb(r['peak'])}" for r in ranks)
        seconds = ", ".join(f"r{r['rank']} {r['update_s']:.2f}" for r in ranks)
        tokens = sum(r["tokens"] for r in ranks) / max(r["update_s"] for r in ranks)
        print(
            f"\n{case} over {len(ranks)} processes against {single['case']}: peak GB {peaks} "
            f"against {gb(single['peak'])}; update s {seconds} against "
            f"{single['update_s']:.2f}; the batch's tokens/s {tokens:.0f} against "
            f"{single['tokens_per_s']:.0f}; gradient norm before clipping "
            + ", ".join(f"r{r['rank']} {r['grad_norm']:.6f}" for r in ranks)
            + f" against {single['grad_norm']:.6f}"
        )


def print_goals(rows: list[Goal]) -> None:
    if not rows:
        return
    print(f"\n{'goal':<50} {'value':>10} {'target':>10} met")
    for name, value, target, met, note in rows:
        small = value is not None and 0 < abs(value) < 1e-3  # a relative difference
        shown = f"{'-':>10}" if value is None else f"{value:10.1e}" if small else f"{value:10.3f}"
        verdict = "" if met is None else ("yes" if met else "NO")
        print(f"{name:<50} {shown} {target:>10} {verdict} {note}".rstrip())


def print_loss_check(by_case: dict[str, dict], args: argparse.Namespace) -> None:
    new = by_case.get("new")
    trl = next((r for c, r in by_case.items() if parse_trl(c) and "error" not in r), None)
    if trl is None:
        return
    _, masks, advantages = make_batch(args, 2)
    counts = torch.tensor([float(m[1:].sum()) for m in masks])  # a first token has no prefix
    # At ratio 1 each token's clipped surrogate is its advantage: the losses differ only by
    # how they average it, per response (llm_gym, TRL's "grpo") or per token ("dapo").
    per_response = -float(advantages.mean())
    per_token = -float((advantages * counts).sum() / counts.sum())
    same = bool((counts == counts[0]).all())
    print(
        f"\nTRL's loss_type: {trl.get('loss_type')!r} (optimizer {trl.get('adamw')}, "
        f"checkpointing {'on' if trl.get('checkpointing') else 'OFF'}). At ratio 1 llm_gym's "
        f"loss, per response then over responses, is {per_response:.6f}; with TRL's dapo "
        f"normalisation (all response tokens of the batch) {per_token:.6f}"
        + (f" — equal here, as every response has {int(counts[0])} tokens." if same else
           " — they differ here: the responses' lengths differ, and so do the gradients.")
    )  # fmt: skip
    if new is not None and "error" not in new:
        print(
            f"loss: llm_gym {new['loss']:.6f}, TRL {trl['loss']:.6f}; gradient norm before "
            f"clipping: llm_gym {new['grad_norm']:.6f}, TRL ({trl['case']}) "
            f"{trl['grad_norm']:.6f} (relative "
            f"difference {abs(new['grad_norm'] - trl['grad_norm']) / new['grad_norm']:.1e})"
        )


def resolve_model(args: argparse.Namespace, cleanup: list) -> str:
    """What every case loads: ``default``, a folder, or a random model of a shape saved into
    a temporary folder now."""
    if args.model == "default" or args.model not in SHAPES:
        return args.model
    folder = tempfile.mkdtemp(prefix=f"bench_train_memory_{args.model}_")
    cleanup.append(lambda: shutil.rmtree(folder, ignore_errors=True))
    start = time.perf_counter()
    save_random_model(args.model, folder, args.seed, args.device)
    print(f"  random {args.model} saved in {time.perf_counter() - start:.0f} s", flush=True)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument(
        "--cases", default=",".join(CASES),
        help=f"comma-separated, of {CASES}, "
        "new[-<budget>][-ckpt|-nockpt][-lora<rank>][-nopack][@<precision>], trl[-<rows>][-bf16]",
    )  # fmt: skip
    parser.add_argument("--seq-len", type=int, default=700, help="tokens per sequence")
    parser.add_argument("--prompt-len", type=int, default=100, help="of which prompt")
    parser.add_argument("--sequences", type=int, default=16, help="sequences in the batch")
    parser.add_argument(
        "--lengths", type=parse_lengths, default=None, metavar="LOW-HIGH",
        help="a ragged batch: lengths drawn uniformly in LOW..HIGH from --seed "
        "(default: all --seq-len)",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="the batch's and random model's seed")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--precision", default="fp32", choices=PRECISIONS, help="new's cases'")
    parser.add_argument(
        "--model", default="default",
        help=f"'default', a model folder, or a random model of a shape: {', '.join(SHAPES)}",
    )  # fmt: skip
    parser.add_argument(
        "--updates", type=int, default=0,
        help=f"updates per case (0: 1 on the CPU, {CUDA_UPDATES} on CUDA; past one, the "
        "median of all but the first counts)",
    )  # fmt: skip
    parser.add_argument(
        "--peak-tflops", type=float, default=None,
        help="MFU's peak (default: by the CUDA device's name, "
        + ", ".join(f"{name} {tflops:g}" for name, tflops in PEAK_TFLOPS.items())
        + "; else none: MFU n/a)",
    )  # fmt: skip
    parser.add_argument(
        "--threads", type=int, default=0,
        help="torch threads a process (0: torch's default; under torchrun, 1 unless "
        "OMP_NUM_THREADS says otherwise)",
    )  # fmt: skip
    parser.add_argument(
        "--nproc-per-node", type=int, default=1, metavar="N",
        help="past 1: each new case also sharded with FSDP2 over N processes (torchrun; gloo "
        "on the CPU, NCCL and a GPU each on CUDA), each with its 1/N of the batch",
    )  # fmt: skip
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per case at most")
    parser.add_argument("--json", help="write the results and goals here")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.lengths is None and not 0 < args.prompt_len < args.seq_len:
        parser.error("--prompt-len must be between 0 and --seq-len")
    if args.updates < 0:
        parser.error("--updates must be 0 (by the device) or more")
    if args.nproc_per_node < 1:
        parser.error("--nproc-per-node must be 1 or more")
    if args.one:
        new = parse_new(args.one)
        if new and new.sharded:
            result = run_rank(args.one, args)
            if result is not None:
                print(json.dumps(result), flush=True)
        else:
            print(json.dumps(run_one(args.one, args)), flush=True)
        return
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    for case in cases:
        if not known(case):
            parser.error(
                f"--cases: each one of {CASES}, new[-<budget>][-ckpt|-nockpt][-lora<rank>]"
                f"[-nopack][-fsdp2][@<precision>] or trl[-<rows>][-bf16], got {case!r}"
            )
    if args.nproc_per_node > 1:  # each new case, then its sharded variant
        cases = [
            variant for case in cases for variant in (
                [case, sharded_variant(case)]
                if parse_new(case) and not parse_new(case).sharded
                and sharded_variant(case) not in cases else [case]
            )
        ]  # fmt: skip
    sharded = [case for case in cases if parse_new(case) and parse_new(case).sharded]
    if sharded and args.nproc_per_node < 2:
        parser.error(f"--cases {sharded[0]}: a sharded case needs --nproc-per-node 2 or more")
    if sharded and args.sequences % args.nproc_per_node:
        parser.error(
            f"--sequences {args.sequences} does not divide by --nproc-per-node "
            f"{args.nproc_per_node}: each process takes an equal share of the batch"
        )
    if args.model not in SHAPES and args.model != "default" and not Path(args.model).is_dir():
        parser.error(
            f"--model: 'default', a folder or one of {', '.join(SHAPES)}, got {args.model!r}"
        )
    if args.threads:
        torch.set_num_threads(args.threads)
    lengths = sequence_lengths(args)
    batch = (
        f"{args.sequences} sequences × {args.seq_len} tokens ({args.prompt_len} prompt + "
        f"{args.seq_len - args.prompt_len} response)" if args.lengths is None else
        f"{args.sequences} sequences of {args.lengths[0]}-{args.lengths[1]} tokens "
        f"({sum(lengths)} tokens, {len(lengths) * max(lengths)} padded to the longest)"
    )  # fmt: skip
    print(
        f"one GRPO update on {batch}, model {args.model}, --precision {args.precision}, on "
        f"{args.device}; {torch.get_num_threads()} torch threads of {os.cpu_count()} cores, "
        f"torch {torch.__version__}; each case in its own process",
        flush=True,
    )
    cleanup: list = []
    results, started = [], time.perf_counter()
    try:
        model = resolve_model(args, cleanup)
        for case in cases:
            print(f"  {case} ...", flush=True)
            for result in per_rank(run_child(case, args, model)):
                add_mfu(result, args)
                results.append(result)
                if "error" in result:
                    print(f"  {result['case']} FAILED: {result['error']}", flush=True)
                else:
                    print(
                        f"  {result['case']}: peak {gb(result['peak'])} GB, update "
                        f"{result['update_s']:.2f} s, {result['tokens_per_s']:.0f} tokens/s",
                        flush=True,
                    )
    finally:
        for step in cleanup:
            step()
    by_case = {r["case"]: r for r in results}
    measured = next(
        (r for r in results if "params" in r and r.get("trainable") == r["params"]), None
    )
    floors = {}
    if measured is not None:
        budgets = sorted({parse_new(c).budget for c in cases if parse_new(c)} or {DEFAULT_BUDGET})
        for budget in budgets:
            floors[budget] = floor_bytes(measured, args, budget)
    print_table(results, floors, args)
    for budget, floor in floors.items():
        print_floor(floor, budget)
    print_loss_check(by_case, args)
    print_sharded(by_case)
    rows = goals(by_case, floors, args)
    print_goals(rows)
    attention = {r.get("attention") for r in results if r.get("attention")}
    seconds = time.perf_counter() - started
    print(f"\n(attention: {', '.join(sorted(attention))}; whole benchmark {seconds:.0f} s)")
    if args.json:
        report = {
            "args": {k: v for k, v in vars(args).items() if k != "one"},
            "lengths": lengths, "results": results, "seconds": seconds,
            "floors": floors,
            "goals": [dict(zip(GOAL_KEYS, row, strict=True)) for row in rows],
        }  # fmt: skip
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
