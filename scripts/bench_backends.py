"""The same rollout with every generation backend, each in a child process of its own: new
tokens/s and its ratio to HF ``generate`` (the transformers backend, same run), start-up
seconds (``Rollout(config)``: model load, and for vLLM the server's start) and peak memory
(this process's peak RSS, plus the VmHWM of every process of a vLLM server's session, read
just before the server stops). ``openai`` samples from a bf16 vLLM server the child starts
first (as a user would), its start shown apart. The rollout: the default task, 64 envs, 64
episodes (one batch), at most 64 new tokens, temperature 1.0, seed 0; tokens/s is the
generated-token count (which differs between backends: responses end early at EOS) over
``run()``'s wall seconds, measured once (a repeat would pay the server's start again). Also
the log-prob agreement: max (mean) |sampled - transformers fp32 scorer| over those responses.

Run: ``HF_HUB_OFFLINE=1 .venv/bin/python scripts/bench_backends.py [--backends vllm,...]``

Last run (2 cores AMD EPYC, torch 2.13, vLLM 0.32 CPU; 301 s in all): new tokens/s (/ HF fp32,
start-up s, peak GiB): transformers 90.1 (1.00x, 1.0, 2.45); transformers-bf16 169.7 (1.88x,
1.1, 1.86); vllm 167.1 (1.86x, 27.3, 4.72); vllm-bf16 269.6 (2.99x, 26.3, 4.24); openai 268.8
(2.99x, 2.9 + 24.1 server, 4.24). vLLM bf16 over HF bf16: 1.59x. Log-prob max (mean) |diff| vs
the fp32 scorer: vllm 1e-4 (1e-5), vllm-bf16 0.29 (0.035), transformers-bf16 0.42 (0.033).
An earlier run of the same gave vllm-bf16 2.77x: the machine is shared, read the second digit
loosely.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from benchmarking import max_diff  # noqa: E402

BACKENDS: dict[str, dict[str, Any]] = {
    "transformers": {},
    "transformers-bf16": {"dtype": "bfloat16"},
    "vllm": {"backend": "vllm"},
    "vllm-bf16": {"backend": "vllm", "backend_args": {"dtype": "bfloat16"}},
    "openai": {"backend": "openai"},  # base_url: a bf16 vLLM server the child starts
}
BASELINE = "transformers"
ROLLOUT = {"num_envs": 64, "episodes": 64, "max_new_tokens": 64, "temperature": 1.0, "seed": 0}


def _stat(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the name (state, ppid, pgrp, session, ...); [] if gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return []


def _vm_hwm_kib(pid: int | str) -> int:
    """Process ``pid``'s peak resident set (VmHWM) in KiB; 0 if it is gone."""
    try:
        return int(re.search(r"VmHWM:\s+(\d+)", Path(f"/proc/{pid}/status").read_text())[1])
    except (OSError, TypeError):
        return 0


def session_pids(sid: int, wait: float = 0.0) -> list[int]:
    """The live (not zombie) processes of session ``sid``, after waiting up to ``wait`` s for
    there to be none (SIGKILLed processes take a moment to go)."""
    deadline = time.monotonic() + wait
    while True:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
        stats = ((p, _stat(p)) for p in pids)  # field 6 (session) is the 4th after the name
        pids = [p for p, f in stats if f and f[3] == str(sid) and f[0] != "Z"]
        if not pids or time.monotonic() > deadline:
            return pids
        time.sleep(0.2)


def peak_gib(sid: int | None) -> float:
    """This process's peak RSS plus the VmHWM of every process of session ``sid``, GiB."""
    kib = _vm_hwm_kib("self") + sum(map(_vm_hwm_kib, session_pids(sid) if sid else []))
    return kib / 2**20


class Recorder:
    """The rollout's policy, keeping every prompt and ``Response`` it saw and gave."""

    def __init__(self, policy: Any) -> None:
        self.policy, self.prompts, self.responses = policy, [], []

    def __call__(self, obs: dict[str, Any]) -> Any:
        actions = self.policy(obs)
        self.prompts += [np.asarray(t, dtype=np.int64) for t in obs["tokens"]]
        self.responses += actions
        return actions


def agreement(prompts: list[np.ndarray], responses: list[Any]) -> tuple[float, float] | None:
    """Max and mean |sampled - transformers fp32 scorer| log-prob over the responses' tokens."""
    if any(r.log_probs is None for r in responses):
        return None
    from llm_gym.lm.loading import load_default_model
    from llm_gym.policies import TransformersPolicy

    model, tokenizer = load_default_model(dtype=torch.float32)
    scorer = TransformersPolicy(model, tokenizer, input_mode="tokens", generate=False)
    scored = scorer.score(prompts, [r.tokens for r in responses])
    sampled = [r.log_probs for r in responses]
    mean = np.mean(np.abs(np.concatenate(sampled) - np.concatenate(scored)))
    return max_diff(sampled, scored), float(mean)


def warnings_in(log: Path) -> list[str]:
    """The distinct WARNING messages of a server log (parameter names folded), with counts."""
    lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
    found = [line.split("]", 1)[-1].strip() for line in lines if "WARNING" in line]
    counts = Counter(re.sub(r"(weight|pid) \S+", r"\1 <.>", w)[:150] for w in found)
    return [f"{w} (x{n})" if n > 1 else w for w, n in counts.items()]


def run_one(name: str) -> dict[str, Any]:
    """Run the rollout with backend ``name`` in this process; what it measured."""
    torch.set_num_threads(os.cpu_count() or 1)
    from llm_gym.lm.loading import model_folder
    from llm_gym.run.rollout import Rollout, RolloutConfig
    from llm_gym.samplers import VLLMServer

    result: dict[str, Any] = {"backend": name}
    server = rollout = None
    sid: int | None = None
    with tempfile.TemporaryDirectory(prefix="bench_backends-") as tmp:
        options = {**ROLLOUT, **BACKENDS[name], "progress": False, "out": tmp, "overwrite": True}
        try:
            if name == "openai":
                start, log = time.perf_counter(), Path(tmp) / "vllm-server.log"  # as vllm's
                folder = model_folder("default")
                server = VLLMServer(folder, dtype="bfloat16", log_path=log)
                result["server_s"] = time.perf_counter() - start
                options["base_url"], sid = server.url, server.process.pid
            start = time.perf_counter()
            rollout = Rollout(RolloutConfig(**options))
            result["startup_s"] = time.perf_counter() - start
            sampler = getattr(rollout.policy, "sampler", None)
            sid = sampler.server.process.pid if hasattr(sampler, "server") else sid
            recorder = rollout.policy = Recorder(policy := rollout.policy)

            def close_measured() -> None:  # run() closes the rollout (and its server) last
                result.setdefault("peak_gib", peak_gib(sid))
                getattr(policy, "close", lambda: None)()

            rollout.close = close_measured  # type: ignore[method-assign]
            start = time.perf_counter()
            summary = rollout.run()
            result["run_s"] = time.perf_counter() - start
            result["tokens"] = summary.generated_tokens
            result["early"] = sum(len(r.tokens) < 64 for r in recorder.responses)
            result["server_warnings"] = warnings_in(Path(tmp) / "vllm-server.log")
        finally:
            if rollout is not None:
                rollout.close()
            if server is not None:
                server.close()
        result["left_running"] = session_pids(sid, wait=10) if sid else []
    result["log_prob_diff"] = agreement(recorder.prompts, recorder.responses)
    return result


def run_child(name: str) -> dict[str, Any]:
    """``run_one(name)`` in a fresh Python process; its JSON line."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, __file__, "--one", name, "--json"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=3600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = "\n".join(done.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"{name} failed (exit {done.returncode}):\n{tail}")
    return json.loads(lines[-1])


def print_table(results: list[dict[str, Any]]) -> None:
    base = next((r for r in results if r["backend"] == BASELINE), None)
    base_rate = base["tokens"] / base["run_s"] if base else None
    print(
        f"\n{'backend':<18} {'new tok':>7} {'early':>5} {'run s':>7} {'tok/s':>7} "
        f"{'/ HF gen':>8} {'start-up s':>10} {'server s':>8} {'peak GiB':>8}"
    )
    for r in results:
        rate = r["tokens"] / r["run_s"]
        ratio = f"{rate / base_rate:7.2f}x" if base_rate else f"{'n/a':>8}"
        server = f"{r['server_s']:8.1f}" if "server_s" in r else f"{'-':>8}"
        print(
            f"{r['backend']:<18} {r['tokens']:7d} {r['early']:5d} {r['run_s']:7.1f} "
            f"{rate:7.1f} {ratio} {r['startup_s']:10.1f} {server} {r['peak_gib']:8.2f}"
        )
    print("\n(early: responses under 64 tokens; server s: openai's own bf16 vLLM server)")
    warnings: dict[str, list[str]] = {}
    for r in results:
        diff = r["log_prob_diff"]
        text = "n/a" if diff is None else f"max |diff| {diff[0]:.4f}, mean {diff[1]:.5f}"
        print(f"log-prob agreement {r['backend']:<18} vs transformers fp32 scorer: {text}")
        for warning in r["server_warnings"]:
            warnings.setdefault(warning, []).append(r["backend"])
        if r["left_running"]:
            print(f"LEFT RUNNING ({r['backend']}): pids {r['left_running']}")
    for warning, names in warnings.items():
        print(f"server warning ({', '.join(names)}): {warning}")
    print()
    for r in [r for r in results if base_rate and r is not base]:
        print(f"{r['backend']} / {BASELINE}: {r['tokens'] / r['run_s'] / base_rate:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated")
    parser.add_argument("--one", choices=sorted(BACKENDS), help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        result = run_one(args.one)
        print(json.dumps(result) if args.json else result, flush=True)
        return
    names = [n.strip() for n in args.backends.split(",") if n.strip()]
    if set(names) - set(BACKENDS):
        parser.error(f"--backends: each one of {list(BACKENDS)}, got {names}")
    print(
        f"machine: {os.cpu_count()} cores ({len(os.sched_getaffinity(0))} usable), "
        f"{os.cpu_count()} torch threads, torch {torch.__version__}; rollout {ROLLOUT}"
    )
    results, start = [], time.perf_counter()
    for name in names:
        print(f"  {name} ...", flush=True)
        try:
            results.append(run_child(name))
        except (RuntimeError, subprocess.TimeoutExpired) as error:
            print(f"  {error}", flush=True)
    print_table(results)
    print(f"\nwhole benchmark: {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
