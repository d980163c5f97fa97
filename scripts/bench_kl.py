"""Cost of the KL reward per step: llm_gym's vector KL wrapper against one bare forward pass,
N single-env KL wrappers and TorchRL's KL transforms, on N GSM8K conversations.

N GSM8K test questions (file order, tokens input mode) get one response each, generated once
up front by the model itself (greedy ``TransformersPolicy``, so every response has real sampled
tokens and their log-probs). The reference model is the same model, so the KL is ~0: a check
that generation and scoring line up. Then only the KL computation is timed, on the same
N prompts + responses every time (N = 32 by default):

- A  bare forward: ``model(input_ids, attention_mask, use_cache=False)`` of the reference model
     on the left-padded prompt+response batch, under ``torch.inference_mode()`` (no log-softmax).
- L  the log-probs alone: ``llm_gym.lm.token_log_probs`` over the response window's logits
     (computed before, not timed), the path the KL wrappers take on that device.
- B  ``llm_gym.wrappers.vector.KLRewardWrapper`` over the native vector env
     (``gym.make_vec(..., vectorization_mode="vector_entry_point")``): one ``env.step``, which
     includes the env's own step (scoring N answers, SAME_STEP autoreset to the same N
     prompts). The env step alone is timed too (B0).
- C  ``llm_gym.wrappers.KLRewardWrapper`` over a single env: N x (``reset`` + ``step``), what
     one would do without the vector wrapper (N forwards of one unpadded conversation).
- D  TorchRL's ``KLRewardTransform`` (its counterpart of B: the generator's log-probs come with
     the data, one reference forward, KL on the response tokens), transform call only.
- E/F (unless ``--skip-retrieve-kl``) ``RetrieveKL`` with a generator model too (two forwards),
     llm_gym vector env step (E) against TorchRL's ``RetrieveKL`` (F). In tokens mode TorchRL's
     ``RetrieveLogProb`` refuses ``assistant_only=True`` (it needs history input to find the
     assistant's tokens), so both run with ``assistant_only=False`` (KL over every token).
- G/H the same in history mode with ``assistant_only=True``, both libraries' default: the
     responses go in as text, each conversation is rendered with the chat template and
     tokenized inside the step (G) or the transform (H).

Ratios (targets): B/A <= 1.10; L/A <= 0.10; B0/A <= 0.20 (at N=128 on a GPU); C/B >= 8;
D/B >= 2; F/E and H/G >= 2. ``--device``/``--dtype`` choose where the models run (TorchRL's
baselines run there too); CUDA is synchronised around every timed call. The methods run
interleaved, once each per round in an order rotated every round, after one untimed call of
each (which also checks that their outputs agree); the table gives medians, and each ratio is
the median of the per-round ratios (wall clock, and the process's CPU time). With
``--profile`` (or if B/A misses its target), ``--profile-reps`` wrapped steps are profiled with
cProfile to show where the time goes.

The KL wrappers ask the scorer for the response positions only (``response_only=True``,
``logits_to_keep``), which is why B can cost less than A: A projects every position onto the
vocabulary. C/B is the batching gain; on a CPU, where a forward is compute-bound, batching
only saves per-call overhead and padding costs work, so it stays near 1 there; the >= 8 target
assumes an accelerator, where one small forward leaves the device mostly idle.

TorchRL is not a dependency of llm_gym: unless ``--no-install`` is given, a missing torchrl is
installed with ``pip install torchrl tensordict torch==<the installed torch>`` so that pip
cannot swap torch for another build. Its transforms are built in ``torchrl_kl_baselines.py``.

Usage::

    python scripts/bench_kl.py [--data-dir DIR] [--num-envs 32] [--rounds 5] [--tiny-only]
        [--device cuda] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import cProfile
import itertools
import json
import os
import pstats
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

import llm_gym  # noqa: F401  (registers LLMChat-GSM8K-v0)
from llm_gym import Response, TransformersPolicy
from llm_gym.envs.data_sources import IterableSource
from llm_gym.lm import forward_logits, left_pad, token_log_probs
from llm_gym.models import load_default_model, tiny_model
from llm_gym.train import DTYPES, resolve_device, resolve_dtype
from llm_gym.wrappers import vector as vector_kl
from llm_gym.wrappers.kl import KLRewardWrapper

sys.path.insert(0, str(Path(__file__).parent))
from benchmarking import describe, ensure_torchrl, synchronize  # noqa: E402

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k"
COEF = 0.1
TARGETS = {
    "B/A": ("<=", 1.10),
    "L/A": ("<=", 0.10),
    "B0/A": ("<=", 0.20),
    "C/B": (">=", 8.0),
    "D/B": (">=", 2.0),
    "F/E": (">=", 2.0),
}
TARGETS["H/G"] = TARGETS["F/E"]


# -- the conversations ----------------------------------------------------------------


@dataclass
class Case:
    """One model's benchmark inputs: N prompts (token ids) and a generated Response each."""

    name: str
    model: Any
    tokenizer: Any
    rows: list[dict[str, Any]]
    prompts: list[np.ndarray]
    responses: list[Response]


def make_vector_env(tokenizer: Any, rows: list[dict[str, Any]], input_mode: str = "tokens") -> Any:
    # One stream shared by the sub-envs, restarted when exhausted: sub-env i holds row i, and
    # after each step the SAME_STEP autoreset brings back exactly the same N prompts.
    return gym.make_vec(
        "LLMChat-GSM8K-v0",
        num_envs=len(rows),
        vectorization_mode="vector_entry_point",
        dataset=IterableSource(rows),
        input_mode=input_mode,
        tokenizer=tokenizer,
    )


def make_case(name: str, model: Any, tokenizer: Any, rows: list, max_new_tokens: int) -> Case:
    envs = make_vector_env(tokenizer, rows)
    obs, _ = envs.reset(seed=0)
    policy = TransformersPolicy(
        model,
        tokenizer,
        input_mode="tokens",
        generate_kwargs={"max_new_tokens": max_new_tokens, "do_sample": False},
    )
    start = time.perf_counter()
    responses = policy(obs)
    print(f"  generated {len(responses)} responses in {time.perf_counter() - start:.1f} s")
    return Case(name, model, tokenizer, rows, [np.asarray(p) for p in obs["tokens"]], responses)


def padded_batch(case: Case, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    pairs = zip(case.prompts, case.responses, strict=True)
    sequences = [np.concatenate([p, r.tokens]) for p, r in pairs]
    return left_pad(sequences, pad_id, case.model.device)


def same_prompts(obs: Any, case: Case, where: str) -> None:
    if not all(np.array_equal(a, b) for a, b in zip(obs["tokens"], case.prompts, strict=True)):
        raise RuntimeError(f"{where}: the env did not come back to the same N prompts")


def same_histories(obs: Any, case: Case, where: str) -> None:
    questions = [history[-1]["content"] for history in obs["history"]]
    if questions != [row["question"] for row in case.rows]:
        raise RuntimeError(f"{where}: the env did not come back to the same N questions")


# -- the timed methods: each returns (wall s, cpu s) of its timed part, and its output ----


class Timed:
    """``run()`` -> (wall seconds, process CPU seconds, output) of one timed call."""

    def __init__(self, call: Callable[[], Any], prepare: Callable[[], Any] | None = None):
        self.call, self.prepare = call, prepare

    def run(self) -> tuple[float, float, Any]:
        arg = self.prepare() if self.prepare is not None else None  # not timed
        synchronize()  # CUDA calls return before the GPU is done
        wall, cpu = time.perf_counter(), time.process_time()
        out = self.call() if self.prepare is None else self.call(arg)
        synchronize()
        return time.perf_counter() - wall, time.process_time() - cpu, out


def bare_forward(model: Any, ids: torch.Tensor, mask: torch.Tensor) -> Timed:
    attention = mask.long()

    def call() -> torch.Tensor:
        with torch.inference_mode():
            return model(input_ids=ids, attention_mask=attention, use_cache=False).logits

    return Timed(call)


def log_probs_only(model: Any, ids: torch.Tensor, mask: torch.Tensor, keep: int) -> Timed:
    with torch.inference_mode():
        logits = forward_logits(model, ids, mask, keep)
    window = slice(-keep, None)

    def call() -> torch.Tensor:
        with torch.inference_mode():
            return token_log_probs(logits, ids[:, window], mask[:, window])

    return Timed(call)


def llm_gym_vector(env: Any, case: Case, actions: list[Any] | None = None) -> Timed:
    obs, _ = env.reset(seed=0)
    check = same_prompts if "tokens" in obs else same_histories
    check(obs, case, "vector env reset")
    actions = case.responses if actions is None else actions

    def call() -> dict[str, Any]:
        obs, _, _, _, info = env.step(actions)
        check(obs, case, "vector env autoreset")
        return info

    return Timed(call)


def llm_gym_single(case: Case, scorer: Any) -> Timed:
    env = KLRewardWrapper(
        gym.make(
            "LLMChat-GSM8K-v0",
            dataset=IterableSource(case.rows),
            input_mode="tokens",
            tokenizer=case.tokenizer,
        ),
        scorer,
        coef=COEF,
    )
    env.reset(seed=0)
    env.unwrapped.reset_dataloader()  # the next reset serves row 0

    def call() -> list[dict[str, Any]]:
        infos = []
        for prompt, response in zip(case.prompts, case.responses, strict=True):
            obs, _ = env.reset()
            if not np.array_equal(obs["tokens"], prompt):
                raise RuntimeError("single env: reset did not serve the prompts in file order")
            infos.append(env.step(response)[4])
        return infos

    return Timed(call)


# -- running and reporting -------------------------------------------------------------


def max_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    if any(x.shape != y.shape for x, y in zip(a, b, strict=True)):
        return float("inf")
    return max(float(np.max(np.abs(x - y), initial=0.0)) for x, y in zip(a, b, strict=True))


def interleaved(methods: dict[str, Timed], rounds: int) -> dict[str, list[tuple[float, float]]]:
    """Each round runs every method once, in an order rotated every round."""
    names = list(methods)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            wall, cpu, _ = methods[name].run()
            times[name].append((wall, cpu))
        summary = "  ".join(
            f"{n} {times[n][-1][0] * 1e3:.0f}/{times[n][-1][1] * 1e3:.0f}" for n in names
        )
        print(f"  round {r + 1}/{rounds} (wall/cpu ms): {summary}", flush=True)
    return times


def paired_ratio(times: dict, num: str, den: str, clock: int) -> float:
    pairs = zip(times[num], times[den], strict=True)
    return statistics.median(a[clock] / b[clock] for a, b in pairs)


def met(key: str, value: float) -> str:
    op, target = TARGETS[key]
    ok = value <= target if op == "<=" else value >= target
    return "yes" if ok else "NO"


LABELS = {
    "A": "bare forward: ref model(input_ids, attention_mask)",
    "L": "  log-probs of the response window alone",
    "B": "llm_gym vector KLRewardWrapper: env.step",
    "B0": "  of which the GSM8K vector env step alone",
    "C": "llm_gym single KLRewardWrapper: N x (reset+step)",
    "D": "TorchRL KLRewardTransform (transform only)",
    "E": "llm_gym vector RetrieveKL(gen, ref): env.step",
    "F": "TorchRL RetrieveKL(gen, ref) (transform only)",
    "G": "llm_gym vector RetrieveKL, history, assistant-only",
    "H": "TorchRL RetrieveKL, history, assistant-only",
}
RATIOS = {
    "B/A": ("B", "A", "vector KL step / bare forward", False),
    "L/A": ("L", "A", "log-probs (gather - logsumexp) / bare forward", False),
    "B0/A": ("B0", "A", "GSM8K vector env step / bare forward", False),
    "C/B": ("C", "B", "N single KL steps / vector KL step", True),
    "D/B": ("D", "B", "TorchRL KLRewardTransform / vector KL step", True),
    "F/E": ("F", "E", "TorchRL RetrieveKL / llm_gym vector RetrieveKL", True),
    "H/G": ("H", "G", "the same, history mode, assistant_only=True", True),
}


def report(times: dict, rounds: int) -> dict[str, float]:
    print(f"\n  median of {rounds} rounds        {'wall ms':>10} {'cpu ms':>10} {'min wall':>10}")
    for key, label in LABELS.items():
        if key in times:
            walls, cpus = [t[0] for t in times[key]], [t[1] for t in times[key]]
            print(
                f"  {key:2} {label:50} {statistics.median(walls) * 1e3:10.1f} "
                f"{statistics.median(cpus) * 1e3:10.1f} {min(walls) * 1e3:10.1f}"
            )
    print(f"\n  {'ratio (median of per-round ratios)':58} {'wall':>7} {'cpu':>7} {'target':>8} met")
    ratios = {}
    for key, (num, den, label, speedup) in RATIOS.items():
        if num not in times or den not in times:
            continue
        wall, cpu = paired_ratio(times, num, den, 0), paired_ratio(times, num, den, 1)
        ratios[key] = wall
        op, target = TARGETS[key]
        unit = "x" if speedup else ""
        print(
            f"  {key:4} {label:53} {wall:6.3f}{unit or ' '} {cpu:6.3f}{unit or ' '} "
            f"{op}{target:5.2f}{unit or ' '} {met(key, wall)}"
        )
    return ratios


# -- profile of one vector KL step ------------------------------------------------------

# (file suffix, function): disjoint parts of vector KLRewardWrapper.step
PROFILE_PARTS = [
    ("llm_gym/policies/_inputs.py", "scored", "encode N prompt+response (Encoder.scored)"),
    ("llm_gym/lm/padding.py", "left_pad", "left-pad the batch"),
    ("llm_gym/policies/transformers.py", "_forward", "model forward (position_ids, no cache)"),
    ("llm_gym/lm/log_probs.py", "token_log_probs", "log-probs: gather + logsumexp(vocab)"),
    ("llm_gym/envs/vector.py", "step", "GSM8K vector env step (score + autoreset)"),
    ("llm_gym/wrappers/_charges.py", "charge", "per-env KL arithmetic (KLCharge.charge)"),
]


def profile_step(env: Any, case: Case) -> dict[str, float]:
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    env.step(case.responses)
    profiler.disable()
    total = time.perf_counter() - start
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    parts: dict[str, float] = {}
    for suffix, func, label in PROFILE_PARTS:
        parts[label] = sum(
            value[3]  # cumulative time
            for (filename, _, name), value in stats.items()
            if name == func and filename.endswith(suffix)
        )
    parts["everything else (python glue, numpy copies, outputs)"] = total - sum(parts.values())
    parts["total (under cProfile)"] = total
    return parts


def profile(env: Any, case: Case, reps: int) -> None:
    """Where one vector KL step's time goes (the parts are read inside each profiled step, so
    their shares do not depend on how busy the machine was between steps)."""
    forward = PROFILE_PARTS[2][2]
    runs = [profile_step(env, case) for _ in range(reps)]
    print(f"\n  profile of the vector KL step ({reps} cProfile'd steps):")
    print(f"    {'part (medians)':56} {'ms':>10} {'of step':>8} {'/forward':>9}")
    for label in runs[0]:
        ms = statistics.median(r[label] for r in runs) * 1e3
        share = statistics.median(r[label] / r["total (under cProfile)"] for r in runs)
        per_forward = statistics.median(r[label] / r[forward] for r in runs)
        print(f"    {label:56} {ms:10.1f} {share:8.1%} {per_forward:9.3f}")


# -- RetrieveKL (generator and reference forwards) and the TorchRL inputs -----------------


def torchrl_inputs(case: Case) -> tuple[Any, ...]:
    return case.model, case.tokenizer, case.rows, case.prompts, case.responses


def add_retrieve_kl(methods: dict[str, Timed], case: Case, scorer: Any, torchrl: bool) -> None:
    """E/F in tokens mode, KL over every token (TorchRL's tokens mode refuses assistant_only);
    G/H in history mode with assistant_only=True, the responses given as text."""
    tokenizer = case.tokenizer
    retrieve_env = vector_kl.RetrieveKL(
        make_vector_env(tokenizer, case.rows), scorer, scorer, coef=COEF, assistant_only=False
    )
    methods["E"] = llm_gym_vector(retrieve_env, case)
    history_env = make_vector_env(tokenizer, case.rows, "history")
    history_scorer = scorer.get_new_version(input_mode="history")
    texts = tokenizer.batch_decode([r.tokens for r in case.responses], skip_special_tokens=True)
    chats = [
        [*history, {"role": "assistant", "content": text}]
        for history, text in zip(history_env.reset(seed=0)[0]["history"], texts, strict=True)
    ]
    history_kl = vector_kl.RetrieveKL(history_env, history_scorer, history_scorer, coef=COEF)
    methods["G"] = llm_gym_vector(history_kl, case, texts)
    if torchrl:
        import torchrl_kl_baselines as baselines

        full = [
            np.concatenate([p, r.tokens]) for p, r in zip(case.prompts, case.responses, strict=True)
        ]
        methods["F"] = Timed(*baselines.retrieve_kl_tokens(case.model, tokenizer, full))
        methods["H"] = Timed(*baselines.retrieve_kl_history(case.model, tokenizer, chats))


def history_check(ours: list[np.ndarray], theirs: list[np.ndarray]) -> str:
    """Our response's reference log-probs against the end of TorchRL's full-conversation ones,
    on the tokens TorchRL counts as the assistant's (non-zero there)."""
    diffs, counted, total = [], 0, 0
    for mine, full in zip(ours, theirs, strict=True):
        tail = full[-len(mine) :]
        kept = tail != 0
        diffs.append(float(np.max(np.abs(mine[kept] - tail[kept]), initial=0.0)))
        counted, total = counted + int(kept.sum()), total + len(mine)
    return (
        f"RetrieveKL history ref log-probs llm_gym vs TorchRL {max(diffs):.1e} on the "
        f"{counted} of our {total} response tokens TorchRL charges"
    )


# -- one model --------------------------------------------------------------------------


def bench_case(case: Case, args: argparse.Namespace, torchrl_version: str | None) -> None:
    model, tokenizer = case.model, case.tokenizer
    scorer = TransformersPolicy(model, tokenizer, input_mode="tokens", generate=False)
    ids, mask = padded_batch(case, scorer.pad_token_id)
    n = len(case.prompts)
    prompt_lens = [len(p) for p in case.prompts]
    resp_lens = [len(r.tokens) for r in case.responses]
    real = sum(prompt_lens) + sum(resp_lens)
    print(
        f"  prompts {min(prompt_lens)}-{max(prompt_lens)} tokens, responses "
        f"{min(resp_lens)}-{max(resp_lens)} tokens; padded batch {n}x{ids.shape[1]} "
        f"({ids.numel()} slots, {real} real tokens = {real / ids.numel():.0%}); "
        f"torch threads {torch.get_num_threads()}"
    )

    vector_env = vector_kl.KLRewardWrapper(make_vector_env(tokenizer, case.rows), scorer, COEF)
    plain_env = make_vector_env(tokenizer, case.rows)
    methods: dict[str, Timed] = {
        "A": bare_forward(model, ids, mask),
        "L": log_probs_only(model, ids, mask, max(resp_lens) + 1),
        "B": llm_gym_vector(vector_env, case),
        "B0": llm_gym_vector(plain_env, case),
        "C": llm_gym_single(case, scorer),
    }
    if torchrl_version is not None:
        import torchrl_kl_baselines as baselines

        methods["D"] = Timed(*baselines.kl_reward_transform(*torchrl_inputs(case)))
    if not args.skip_retrieve_kl:
        add_retrieve_kl(methods, case, scorer, torchrl_version is not None)

    # One untimed call of each (warm-up), whose outputs are checked against each other.
    outputs = {name: method.run()[2] for name, method in methods.items()}
    kl_vector = list(outputs["B"]["kl"])
    ref_vector = list(outputs["B"]["ref_log_probs"])
    logits = outputs["A"]
    bare_lp = token_log_probs(logits, ids, mask).cpu().numpy()
    window_lp = outputs["L"].cpu().numpy()
    window_ref = [window_lp[i, window_lp.shape[1] - k :] for i, k in enumerate(resp_lens)]
    bare_ref = [bare_lp[i, ids.shape[1] - k :] for i, k in enumerate(resp_lens)]
    checks = [
        f"max|kl| {max(float(np.abs(k).max()) for k in kl_vector):.1e} (ref = generator)",
        f"vector vs bare-forward ref log-probs {max_diff(ref_vector, bare_ref):.1e}",
        f"window vs full log-probs {max_diff(window_ref, bare_ref):.1e}",
        f"vector vs single kl {max_diff(kl_vector, [i['kl'] for i in outputs['C']]):.1e}",
    ]
    if "D" in outputs:
        checks.append(f"vs TorchRL KLRewardTransform kl {max_diff(kl_vector, outputs['D']):.1e}")
    if "F" in outputs:
        diff = max_diff(list(outputs["E"]["kl"]), outputs["F"])
        checks.append(f"RetrieveKL tokens llm_gym vs TorchRL kl {diff:.1e}")
    if "H" in outputs:
        checks.append(history_check(list(outputs["G"]["ref_log_probs"]), outputs["H"]))
    print("  checks: " + "; ".join(checks))
    if torchrl_version is None:
        print("  TorchRL not available: D, F and H skipped")
    del outputs, logits

    times = interleaved(methods, args.rounds)
    ratios = report(times, args.rounds)
    if args.profile or ratios.get("B/A", 0.0) > TARGETS["B/A"][1]:
        profile(vector_env, case, args.profile_reps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_dir = os.environ.get("LLM_GYM_GSM8K_PATH", str(DEFAULT_DATA))
    parser.add_argument("--data-dir", default=default_dir, help="folder with test.jsonl")
    parser.add_argument("--num-envs", type=int, default=32, help="conversations (N)")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="response length cap")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds; medians count")
    parser.add_argument("--tiny-only", action="store_true", help="skip SmolLM2 (quick run)")
    parser.add_argument("--skip-retrieve-kl", action="store_true", help="no E-H (2 forwards)")
    parser.add_argument("--profile", action="store_true", help="profile even if B/A is met")
    parser.add_argument("--profile-reps", type=int, default=3, help="profiled steps")
    parser.add_argument("--no-install", action="store_true", help="never pip-install torchrl")
    parser.add_argument("--no-torchrl", action="store_true", help="skip TorchRL (D, F, H)")
    parser.add_argument("--device", default="auto", help="'auto', 'cpu' or 'cuda'")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message=".*nested tensors is in prototype stage.*")
    warnings.filterwarnings("ignore", message=".*size_average and reduce args.*")

    torchrl_version = None if args.no_torchrl else ensure_torchrl(not args.no_install)
    device, dtype = resolve_device(args.device), resolve_dtype(args.dtype)
    smollm2, tokenizer = load_default_model(device=device, dtype=dtype)
    with open(Path(args.data_dir) / "test.jsonl", encoding="utf-8") as f:
        rows = [json.loads(line) for line in itertools.islice(f, args.num_envs)]
    print(f"{describe(device, dtype)}, torchrl {torchrl_version or 'not available'}")
    print(f"{len(rows)} GSM8K test questions from {args.data_dir}; tokens mode; coef {COEF}")

    models = [] if args.tiny_only else [("SmolLM2-135M-Instruct", smollm2)]
    models.append(
        ("tiny (llama, 2 layers x 64, SmolLM2 tokenizer)", tiny_model(tokenizer).to(device, dtype))
    )
    for name, model in models:
        print(f"\n== {name} ==")
        case = make_case(name, model, tokenizer, rows, args.max_new_tokens)
        bench_case(case, args, torchrl_version)
    print(
        "\nA: one forward of the padded batch (no log-softmax); B includes the env's own step "
        "(B0); C includes N resets; D/F/H time TorchRL's transform call only (inputs prebuilt)."
    )


if __name__ == "__main__":
    main()
