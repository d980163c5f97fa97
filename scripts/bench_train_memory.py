"""Peak memory and seconds of ONE GRPO update (forward + backward + AdamW step) on a fixed
batch, four ways side by side (issue 42, item 6):

- ``today``: the update llm_gym's trainer ran before bf8f545 (``git show bf8f545^:
  llm_gym/train/grpo.py``, ``_optimize``): ``TransformersPolicy.get_dist`` over minibatches of
  8 sequences (the whole ``(B, T, V)`` logits), ``dist.log_prob(ids)``, ``grpo_loss``,
  ``(loss * rows / n).backward()``, no activation checkpointing, the model in eval mode.
- ``new``: llm_gym's update now, ``GRPOTrainer._optimize`` of a trainer built from
  ``GRPOConfig(model="default", ...)``: micro-batches by ``max_tokens_per_microbatch`` (4096;
  ``new-2048``, ``new-8192`` run the same with that budget), activation checkpointing as
  GRPOConfig decides by default (for micro-batches of ``CHECKPOINT_TOKENS`` padded tokens, or
  half the budget if less, or more; ``new-<budget>-ckpt`` / ``-nockpt`` force it on / off),
  ``selected_log_probs`` (the taken tokens' log-probs through the output layer in chunks).
- ``floor`` (computed, not measured): fp32 weights + gradients + AdamW's two moments, 4 ×
  params × 4 bytes, plus the checkpointed activations of one micro-batch, num_hidden_layers ×
  its padded tokens × hidden_size × 4 bytes.
- ``trl``: TRL's ``GRPOTrainer`` (its defaults: ``loss_type="dapo"``, its fused LM head; with
  ``gradient_checkpointing=True``, CPU, no bf16) on the same batch, without generating: its
  ``compute_loss(model, inputs)`` on ``inputs`` in the format ``_generate_and_score_completions``
  returns, ``accelerator.backward``, ``clip_grad_norm_`` to ``max_grad_norm`` and the optimizer
  of ``trainer.create_optimizer()`` (AdamW, fused: transformers' default ``optim``), as
  ``Trainer.train`` would for one step with ``per_device_train_batch_size`` = the batch.
  ``trl-<rows>`` (e.g. ``trl-4``): ``rows`` sequences a forward and gradient accumulation over
  the batch, as ``_prepare_inputs`` slices a generation batch (still one optimizer step).

The batch: ``--sequences`` (16) sequences of ``--seq-len`` (700) tokens, ``--prompt-len`` (100)
prompt + the rest response, random token ids within the vocabulary from ``--seed``;
advantages alternate +1, -1. The model: SmolLM2-135M-Instruct (``load_default_model``),
float32, CPU, learning rate 5e-5, gradient clipping at 1.0, clip coefficient 0.2.

Each case runs in its own Python process, so that its peak RSS (``ru_maxrss``) is its alone:
the model and optimizer are set up first (timed apart: ``setup s``), every weight is read once
(they load memory-mapped, and would otherwise become resident only during the update), the
RSS is read, then exactly one update is timed (``update s``). ``own GB`` is the peak RSS
minus the RSS before the update: what the update itself adds (gradients and AdamW's moments
included, as they are allocated by the first update). The gradient norm before clipping
(what ``clip_grad_norm_`` returns) is recorded in every case: equal norms say the three
implementations compute the same gradient; at ratio 1 the loss value itself is
``-mean(advantages)`` (0 here).

Run (offline; 15-30 minutes on 2 shared cores; ``today`` peaks near 16 GB, ``trl`` near 8)::

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/bench_train_memory.py
    .venv/bin/python scripts/bench_train_memory.py --cases new,new-2048-ckpt,trl --threads 1

On a CPU that other work shares, ``--threads 1`` gives steadier seconds: with 2 threads a
descheduled thread leaves the other spinning, and wall and CPU time both grow with the load.
RSS counts what glibc's allocator keeps of freed tensors: the trainer (the ``new`` cases) sets
its mmap threshold to 1 MiB around a large update; ``MALLOC_MMAP_THRESHOLD_`` in the
environment (the cases inherit it) sets it for every case, TRL's too.

Last run (idle 2-core CPU, ``--cases new,new-2048,trl --threads 1``, torch 2.13,
transformers 5.24, TRL 1.16; peak GB, update s): new 2.84, 173 (floor 2.39: 1.19x; without
the interpreter's own RSS 1.09x); new-2048 2.84, 185; trl 8.15, 168 (new/TRL: 0.35x the
peak, 1.03x the time). The trainer lowers glibc's mmap threshold around a large update on
CPU (``set_host_mmap_threshold``); before it: new 3.83-4.20, 136-140; new-2048 (then not
checkpointed) 4.72, 120; today 16.27, 139; trl-4 6.47, 158.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch

CASES = ("today", "new", "new-2048", "new-8192", "trl")
# new[-<budget>][-ckpt|-nockpt]: the new path with that token budget (default 4096) and
# activation checkpointing as GRPOConfig decides by default, or forced on or off.
CHECKPOINTING = {"": None, "ckpt": True, "nockpt": False}
LEARNING_RATE, MAX_GRAD_NORM, CLIP_COEF, MINIBATCH = 5e-5, 1.0, 0.2, 8
DEFAULT_BUDGET = 4096  # GRPOConfig.max_tokens_per_microbatch's default
GB = 1e9
LABELS = {
    "today": "today's path (get_dist, minibatch 8)",
    "new": "new path (llm_gym _optimize, 4096 tokens)",
    "trl": "TRL 1.16 GRPOTrainer (checkpointing)",
}


def parse_new(case: str) -> tuple[int, bool | None] | None:
    """``new[-<budget>][-ckpt|-nockpt]`` -> (budget, gradient_checkpointing); None otherwise."""
    name, *rest = case.split("-")
    budget = int(rest.pop(0)) if rest and rest[0].isdigit() else DEFAULT_BUDGET
    if name != "new" or len(rest) > 1 or (rest and rest[0] not in CHECKPOINTING):
        return None
    return budget, CHECKPOINTING[rest[0] if rest else ""]


def parse_trl(case: str) -> tuple[int | None] | None:
    """``trl[-<rows>]`` -> (sequences per forward, None: the whole batch); None otherwise."""
    name, _, rows = case.partition("-")
    if name != "trl" or (rows and not rows.isdigit()):
        return None
    return (int(rows) if rows else None,)


def label(case: str) -> str:
    if case in LABELS:
        return LABELS[case]
    if parse_trl(case):
        return f"TRL, {parse_trl(case)[0]} a forward, gradient accumulation"
    budget, checkpointing = parse_new(case)
    forced = {None: "", True: ", ckpt forced", False: ", no ckpt"}[checkpointing]
    return f"new path, {budget} tokens a micro-batch{forced}"


# -- one case, in its own process -------------------------------------------------------


def rss_bytes() -> int:
    """The process's resident set size now."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def make_batch(args: argparse.Namespace, vocab: int) -> tuple[list, list, torch.Tensor]:
    """The fixed batch: token ids, response masks, advantages (+1, -1, +1, ...)."""
    rng = np.random.default_rng(args.seed)
    tokens = [rng.integers(0, vocab, size=args.seq_len) for _ in range(args.sequences)]
    masks = [np.arange(args.seq_len) >= args.prompt_len for _ in range(args.sequences)]
    advantages = torch.tensor([1.0 if i % 2 == 0 else -1.0 for i in range(args.sequences)])
    return tokens, masks, advantages


def record_grad_norms() -> list[float]:
    """Every ``torch.nn.utils.clip_grad_norm_`` call's result (the norm before clipping) from
    now on; llm_gym's trainer looks the function up at each call, so it is recorded too."""
    norms: list[float] = []
    original = torch.nn.utils.clip_grad_norm_

    def recording(*a: Any, **k: Any) -> torch.Tensor:
        norm = original(*a, **k)
        norms.append(float(norm))
        return norm

    torch.nn.utils.clip_grad_norm_ = recording
    return norms


def time_steps(optimizer: torch.optim.Optimizer) -> list[tuple[float, int]]:
    """Each of ``optimizer``'s steps from now on: its wall seconds, and the peak RSS as it
    began (the forwards' and backwards' peak)."""
    steps: list[tuple[float, int]] = []
    original = optimizer.step

    def step(*a: Any, **k: Any) -> Any:
        peak, start = peak_rss_bytes(), time.perf_counter()
        out = original(*a, **k)
        steps.append((time.perf_counter() - start, peak))
        return out

    optimizer.step = step
    return steps


def adamw_kind(optimizer: torch.optim.Optimizer) -> str:
    """How the AdamW runs: fused, foreach or the per-tensor loop (torch's CPU default)."""
    if optimizer.defaults.get("fused"):
        return "fused"
    return "foreach" if optimizer.defaults.get("foreach") else "loop"


def setup_today(args: argparse.Namespace, info: dict[str, Any]) -> Any:
    from llm_gym.lm.loading import load_default_model
    from llm_gym.policies import TransformersPolicy
    from llm_gym.train.loss import grpo_loss

    model, tokenizer = load_default_model()
    info["model"] = model
    scorer = TransformersPolicy(model, tokenizer, input_mode="tokens", generate=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    info["optimizer"] = optimizer
    tokens, masks, advantages = make_batch(args, model.config.vocab_size)
    n = len(tokens)
    batches = [range(i, min(i + MINIBATCH, n)) for i in range(0, n, MINIBATCH)]
    info["forwards"] = "+".join(str(len(rows)) for rows in batches)

    def update() -> float:  # bf8f545^'s GRPOTrainer._optimize, one epoch
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


def setup_new(
    args: argparse.Namespace, info: dict[str, Any], budget: int, checkpointing: bool | None
) -> Any:
    import llm_gym.train.update as update_module
    from llm_gym.train import GRPOConfig, GRPOTrainer

    folder = tempfile.mkdtemp(prefix="bench_train_memory_")
    info["cleanup"].append(lambda: shutil.rmtree(folder, ignore_errors=True))
    config = GRPOConfig(
        model="default", out=str(Path(folder) / "run"), eval_episodes=0, progress=False,
        groups=max(1, args.sequences // 8), group_size=8, learning_rate=LEARNING_RATE,
        max_tokens_per_microbatch=budget, max_grad_norm=MAX_GRAD_NORM, clip_coef=CLIP_COEF,
        minibatch_size=MINIBATCH,
    )  # fmt: skip
    if checkpointing is not None:  # else GRPOConfig's default
        config.gradient_checkpointing = checkpointing
    trainer = GRPOTrainer(config)
    info["cleanup"].insert(0, lambda: (trainer.close(), trainer.lock.release()))
    info["model"], info["optimizer"] = trainer.model, trainer.optimizer
    tokens, masks, advantages = make_batch(args, trainer.model.config.vocab_size)
    # Each forward's rows, and whether it ran checkpointed (train mode, layers flagged).
    forwards, scored = [], update_module.selected_log_probs

    def recording(model: torch.nn.Module, ids: torch.Tensor, *a: Any, **k: Any) -> torch.Tensor:
        flagged = any(getattr(m, "gradient_checkpointing", False) for m in model.modules())
        forwards.append(f"{ids.shape[0]}{'c' if model.training and flagged else ''}")
        return scored(model, ids, *a, **k)

    update_module.selected_log_probs = recording

    def update() -> float:
        loss = trainer._optimize(tokens, masks, advantages)["loss"]
        info["forwards"] = "+".join(forwards)
        return loss

    return update


def setup_trl(args: argparse.Namespace, info: dict[str, Any], rows: int | None) -> Any:
    import trl
    from datasets import Dataset
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer as TRLTrainer
    from trl.trainer.utils import split_tensor_dict

    from llm_gym.lm.loading import load_default_model

    info["trl_version"] = trl.__version__
    model, tokenizer = load_default_model()
    info["model"] = model
    folder = tempfile.mkdtemp(prefix="bench_train_memory_trl_")
    info["cleanup"].append(lambda: shutil.rmtree(folder, ignore_errors=True))
    n, response = args.sequences, args.seq_len - args.prompt_len
    rows = rows or n  # per forward; the rest of the batch by gradient accumulation
    if n % rows:
        raise ValueError(f"trl-{rows}: {n} sequences do not split into forwards of {rows}")
    accumulated = n // rows
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # gradient_checkpointing's new name
        config = TRLConfig(
            output_dir=folder, use_cpu=True, bf16=False, report_to="none",
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
    tokens, masks, advantages = make_batch(args, model.config.vocab_size)
    ids = torch.from_numpy(np.stack(tokens)).to(trainer.accelerator.device)
    prompt, completion = ids[:, : args.prompt_len], ids[:, args.prompt_len :]
    completion_mask = torch.from_numpy(np.stack(masks)[:, args.prompt_len :]).long()
    # The keys _generate_and_score_completions returns with num_iterations 1, no vLLM, no
    # reference model (beta 0), text only: old_per_token_logps absent (None).
    inputs = {
        "prompt_ids": prompt,
        "prompt_mask": torch.ones_like(prompt),
        "completion_ids": completion,
        "completion_mask": completion_mask,
        "advantages": advantages,
        "num_items_in_batch": completion_mask.sum(),
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


def run_one(case: str, args: argparse.Namespace) -> dict[str, Any]:
    """Set ``case`` up, then time exactly one update; its numbers."""
    if args.threads:
        torch.set_num_threads(args.threads)
    result: dict[str, Any] = {"case": case, "threads": torch.get_num_threads()}
    info: dict[str, Any] = {"cleanup": []}
    result["rss_start"] = rss_bytes()
    start = time.perf_counter()
    try:
        if case == "today":
            update = setup_today(args, info)
        elif parse_new(case):
            update = setup_new(args, info, *parse_new(case))
        elif parse_trl(case):
            update = setup_trl(args, info, parse_trl(case)[0])
        else:
            raise ValueError(f"unknown case {case!r}")
        result["setup_s"] = time.perf_counter() - start
        model = info.pop("model")
        result["params"] = sum(p.numel() for p in model.parameters())
        result["layers"] = model.config.num_hidden_layers
        result["hidden"] = model.config.hidden_size
        result["attention"] = model.config._attn_implementation
        optimizer = info.pop("optimizer")
        result["adamw"] = f"{type(optimizer).__name__} {adamw_kind(optimizer)}"
        # The weights are loaded memory-mapped: read each once, so that they are resident
        # before the update and the RSS after setup counts them.
        with torch.no_grad():
            for p in model.parameters():
                p.sum()
        norms, steps = record_grad_norms(), time_steps(optimizer)
        result["rss_before"], result["peak_before"] = rss_bytes(), peak_rss_bytes()
        start, cpu = time.perf_counter(), time.process_time()
        loss = update()
        result["update_s"] = time.perf_counter() - start
        result["update_cpu_s"] = time.process_time() - cpu  # all threads
        result["peak"], result["rss_after"] = peak_rss_bytes(), rss_bytes()
        result["loss"], result["grad_norm"] = float(loss), norms[-1] if norms else None
        result["step_s"] = sum(seconds for seconds, _ in steps)
        result["peak_before_step"] = steps[0][1] if steps else None
    except Exception as error:  # the case cannot be built or run: say why, no numbers
        traceback.print_exc()
        result["error"] = f"{type(error).__name__}: {error}".splitlines()[0][:300]
    finally:
        for cleanup in info.pop("cleanup"):
            cleanup()
    result.update({k: v for k, v in info.items() if isinstance(v, str | int | float | bool)})
    return result


# -- the parent: one process per case, the table and the goals ---------------------------


def run_child(case: str, args: argparse.Namespace) -> dict[str, Any]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    command = [
        sys.executable, __file__, "--one", case, "--seq-len", str(args.seq_len),
        "--prompt-len", str(args.prompt_len), "--sequences", str(args.sequences),
        "--seed", str(args.seed), "--threads", str(args.threads or 0),
    ]  # fmt: skip
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, env=env, timeout=args.timeout
        )
    except subprocess.TimeoutExpired:
        return {"case": case, "error": f"no result within --timeout {args.timeout} s"}
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


def budget_of(case: str) -> int:
    return parse_new(case)[0]


def floor_bytes(result: dict[str, Any], args: argparse.Namespace, budget: int) -> dict:
    """The floor of a new-path update with ``budget``: its parts and how they are computed."""
    from llm_gym.train.loss import microbatches

    split = microbatches([args.seq_len] * args.sequences, budget, MINIBATCH)
    tokens = max(len(rows) for rows in split) * args.seq_len  # all one length: no padding
    params, layers, hidden = result["params"], result["layers"], result["hidden"]
    state, activations = 4 * params * 4, layers * tokens * hidden * 4
    return {"state": state, "activations": activations, "total": state + activations,
            "tokens": tokens, "params": params, "layers": layers, "hidden": hidden}  # fmt: skip


def gb(value: float | None) -> str:
    return "-" if value is None else f"{value / GB:.2f}"


def print_table(results: list[dict[str, Any]], floors: dict[int, dict]) -> None:
    print(
        f"\n{'case':<50} {'peak GB':>7} {'fwd+bwd':>7} {'before':>6} {'own GB':>6} "
        f"{'update s':>8} {'cpu s':>7} {'step s':>6} {'setup s':>7} {'forwards':>9} "
        f"{'loss':>9} {'grad norm':>9}"
    )
    for r in results:
        name = label(r["case"])
        if "error" in r:
            print(f"{name:<50} FAILED: {r['error']}")
            continue
        own = r["peak"] - r["rss_before"]
        print(
            f"{name:<50} {gb(r['peak']):>7} {gb(r['peak_before_step']):>7} "
            f"{gb(r['rss_before']):>6} {gb(own):>6} {r['update_s']:8.1f} "
            f"{r['update_cpu_s']:7.1f} {r['step_s']:6.1f} {r['setup_s']:7.1f} "
            f"{r.get('forwards', ''):>9} {r['loss']:9.2e} {r['grad_norm']:9.4f}"
        )
        if r["peak"] <= r["peak_before"]:
            print(f"{'':<50} (the peak was reached before the update: setup's, not its)")
    for budget, floor in floors.items():
        name = f"floor (computed), {budget} tokens a micro-batch"
        print(f"{name:<50} {gb(floor['total']):>7}")
    print("\n(GB = 10^9 bytes; peak: the process's peak RSS; fwd+bwd: the peak RSS as the")
    print(" optimizer's step began; before: RSS after setup (weights resident), before the update;")
    print(" own: peak - before, what the update adds (gradients and AdamW's moments included);")
    print(" update s: wall clock; cpu s: the process's CPU time, all threads; step s: of which")
    print(" the optimizer's step, wall; forwards: sequences per forward, c: checkpointed;")
    print(" grad norm: before clipping, as clip_grad_norm_ returns it)")
    kinds = {r["case"]: r["adamw"] for r in results if "adamw" in r}
    print("optimizers: " + "; ".join(f"{case} {kind}" for case, kind in kinds.items()))


def print_floor(floor: dict, budget: int) -> None:
    print(
        f"\nfloor at --max-tokens-per-microbatch {budget}: weights + gradients + AdamW's two "
        f"moments, 4 × {floor['params']:,} params × 4 bytes = {gb(floor['state'])} GB; plus the "
        f"checkpointed activations of one micro-batch, {floor['layers']} layers × "
        f"{floor['tokens']} tokens × {floor['hidden']} hidden × 4 bytes = "
        f"{gb(floor['activations'])} GB; total {gb(floor['total'])} GB"
    )


def print_goals(by_case: dict[str, dict], floors: dict[int, dict]) -> None:
    def ok(r: dict | None) -> bool:
        return r is not None and "error" not in r

    new, today = by_case.get("new"), by_case.get("today")
    trls = {case: r for case, r in by_case.items() if parse_trl(case)}
    print(f"\n{'goal (issue 42)':<50} {'value':>10} {'target':>10} met")
    rows: list[tuple[str, float | None, str, bool | None, str]] = []
    if ok(new):
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
        if ok(today):
            rows.append(("today's peak / new peak", today["peak"] / new["peak"], "", None, ""))
            for clock, key in (("wall", "update_s"), ("CPU time", "update_cpu_s")):
                ratio = today[key] / new[key]
                rows.append((f"today's s / new s ({clock})", ratio, "", None, ""))
            own = (today["peak"] - today["rss_before"]) / (new["peak"] - new["rss_before"])
            rows.append(("today's own GB / new own GB", own, "", None, ""))
    else:
        rows.append(("new path", None, "", None, "missing or failed: no goals to check"))
    for label, value, target, met, note in rows:
        shown = f"{value:10.3f}" if value is not None else f"{'-':>10}"
        verdict = "" if met is None else ("yes" if met else "NO")
        print(f"{label:<50} {shown} {target:>10} {verdict} {note}".rstrip())


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
    print(
        f"\nTRL's loss_type: {trl.get('loss_type')!r} (optimizer {trl.get('adamw')}, "
        f"checkpointing {'on' if trl.get('checkpointing') else 'OFF'}). At ratio 1 llm_gym's "
        f"loss, per response then over responses, is {per_response:.6f}; with TRL's dapo "
        f"normalisation (all response tokens of the batch) {per_token:.6f} — equal here, as "
        f"every response has {int(counts[0])} tokens."
    )
    if new is not None and "error" not in new:
        print(
            f"loss: llm_gym {new['loss']:.6f}, TRL {trl['loss']:.6f}; gradient norm before "
            f"clipping: llm_gym {new['grad_norm']:.6f}, TRL ({trl['case']}) "
            f"{trl['grad_norm']:.6f} (relative "
            f"difference {abs(new['grad_norm'] - trl['grad_norm']) / new['grad_norm']:.1e})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument(
        "--cases", default=",".join(CASES),
        help=f"comma-separated, of {CASES}, new-<budget>[-ckpt|-nockpt], trl-<rows>",
    )  # fmt: skip
    parser.add_argument("--seq-len", type=int, default=700, help="tokens per sequence")
    parser.add_argument("--prompt-len", type=int, default=100, help="of which prompt")
    parser.add_argument("--sequences", type=int, default=16, help="sequences in the batch")
    parser.add_argument("--seed", type=int, default=0, help="the token ids' seed")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per case at most")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not 0 < args.prompt_len < args.seq_len:
        parser.error("--prompt-len must be between 0 and --seq-len")
    if args.one:
        print(json.dumps(run_one(args.one, args)), flush=True)
        return
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    for case in cases:
        if case != "today" and parse_new(case) is None and parse_trl(case) is None:
            parser.error(
                f"--cases: each one of {CASES}, new-<budget>[-ckpt|-nockpt] or trl-<rows>, "
                f"got {case!r}"
            )
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"one GRPO update on {args.sequences} sequences × {args.seq_len} tokens "
        f"({args.prompt_len} prompt + {args.seq_len - args.prompt_len} response), "
        f"SmolLM2-135M-Instruct float32 on CPU; {torch.get_num_threads()} torch threads of "
        f"{os.cpu_count()} cores, torch {torch.__version__}; each case in its own process",
        flush=True,
    )
    results, started = [], time.perf_counter()
    for case in cases:
        print(f"  {case} ...", flush=True)
        result = run_child(case, args)
        results.append(result)
        if "error" in result:
            print(f"  {case} FAILED: {result['error']}", flush=True)
        else:
            print(
                f"  {case}: peak {gb(result['peak'])} GB, update {result['update_s']:.1f} s",
                flush=True,
            )
    by_case = {r["case"]: r for r in results}
    measured = next((r for r in results if "params" in r), None)
    floors = {}
    if measured is not None:
        budgets = sorted({budget_of(c) for c in cases if parse_new(c)} or {DEFAULT_BUDGET})
        for budget in budgets:
            floors[budget] = floor_bytes(measured, args, budget)
    print_table(results, floors)
    for budget, floor in floors.items():
        print_floor(floor, budget)
    print_loss_check(by_case, args)
    print_goals(by_case, floors)
    attention = {r.get("attention") for r in results if r.get("attention")}
    print(f"\n(attention: {', '.join(sorted(attention))}; whole benchmark "
          f"{time.perf_counter() - started:.0f} s)")  # fmt: skip


if __name__ == "__main__":
    main()
