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
cannot swap torch for another build. Its transforms are built in ``torchrl_kl_baselines.py``,
llm_gym's timed methods in ``kl_methods.py``; timing and the table in ``benchmarking.py``.

Usage::

    python scripts/bench_kl.py [--data-dir DIR] [--num-envs 32] [--rounds 5] [--tiny-only]
        [--device cuda] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import os
import sys
import warnings
from pathlib import Path

import numpy as np
import torch

from llm_gym import TransformersPolicy
from llm_gym.lm import token_log_probs
from llm_gym.lm.loading import load_default_model, tiny_model
from llm_gym.run.setup import DTYPES, resolve_device, resolve_dtype
from llm_gym.wrappers import vector as vector_kl

sys.path.insert(0, str(Path(__file__).parent))
from benchmarking import Timed, describe, ensure_torchrl, interleaved, max_diff, profile, report
from kl_methods import (
    COEF,
    Case,
    add_retrieve_kl,
    bare_forward,
    llm_gym_single,
    llm_gym_vector,
    log_probs_only,
    make_case,
    make_vector_env,
    padded_batch,
)

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k"
TARGETS = {
    "B/A": ("<=", 1.10),
    "L/A": ("<=", 0.10),
    "B0/A": ("<=", 0.20),
    "C/B": (">=", 8.0),
    "D/B": (">=", 2.0),
    "F/E": (">=", 2.0),
}
TARGETS["H/G"] = TARGETS["F/E"]


# -- running and reporting -------------------------------------------------------------


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


# -- profile of one vector KL step ------------------------------------------------------

# (file suffix, function): disjoint parts of vector KLRewardWrapper.step
PROFILE_PARTS = [
    ("llm_gym/policies/transformers.py", "scored", "encode N prompt+response (Encoder.scored)"),
    ("llm_gym/lm/tensors.py", "left_pad", "left-pad the batch"),
    ("llm_gym/policies/transformers.py", "_forward", "model forward (position_ids, no cache)"),
    ("llm_gym/lm/tensors.py", "token_log_probs", "log-probs: gather + logsumexp(vocab)"),
    ("llm_gym/envs/vector.py", "step", "GSM8K vector env step (score + autoreset)"),
    ("llm_gym/wrappers/kl.py", "charge", "per-env KL arithmetic (KLCharge.charge)"),
]


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
    baselines = importlib.import_module("torchrl_kl_baselines") if torchrl_version else None
    if baselines is not None:
        inputs = case.model, tokenizer, case.rows, case.prompts, case.responses
        methods["D"] = Timed(*baselines.kl_reward_transform(*inputs))
    if not args.skip_retrieve_kl:
        add_retrieve_kl(methods, case, scorer, baselines)

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
        checks.append(baselines.history_check(list(outputs["G"]["ref_log_probs"]), outputs["H"]))
    print("  checks: " + "; ".join(checks))
    if torchrl_version is None:
        print("  TorchRL not available: D, F and H skipped")
    del outputs, logits

    times = interleaved(methods, args.rounds)
    ratios = report(times, args.rounds, LABELS, RATIOS, TARGETS)
    if args.profile or ratios.get("B/A", 0.0) > TARGETS["B/A"][1]:
        step = lambda: vector_env.step(case.responses)  # noqa: E731
        forward = PROFILE_PARTS[2][2]
        profile(step, PROFILE_PARTS, forward, args.profile_reps, "the vector KL step")


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
