"""scripts/bench_train_memory.py --nproc-per-node 2 (issue 52, item 6), for real on the CPU:
the new case sharded with FSDP2 over two torchrun processes (gloo), a row per process, each
with its own peak, and the same gradient norm as one process on the whole batch."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import llm_gym

# The benchmark in two processes.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def bench(*options: str, timeout: int = 300) -> subprocess.CompletedProcess:
    # The script imports the llm_gym these tests import (the scripts' folder is its sys.path[0]).
    path = [str(Path(llm_gym.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join(filter(None, path))}
    return subprocess.run(
        [sys.executable, "scripts/bench_train_memory.py", *options],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env,
    )  # fmt: skip


def test_two_processes_report_a_row_each_and_one_process_gradient_norm(tiny_dir, tmp_path):
    out = tmp_path / "bench.json"
    done = bench(
        "--model", tiny_dir, "--sequences", "4", "--seq-len", "40", "--prompt-len", "8",
        "--cases", "new", "--threads", "1", "--nproc-per-node", "2", "--json", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    results = {r["case"]: r for r in report["results"]}
    assert set(results) == {"new", "new-fsdp2/r0", "new-fsdp2/r1"}
    for result in results.values():
        assert "error" not in result, result["error"]
        assert result["peak"] > 0 and result["update_s"] > 0
    single = results["new"]
    for rank in (0, 1):
        row = results[f"new-fsdp2/r{rank}"]
        assert row["rank"] == rank and row["world_size"] == 2
        assert row["rows"] == [2 * rank, 2 * rank + 2]  # its half of the batch
        assert row["tokens"] == 80 and row["params"] == single["params"]  # the whole model's
        assert row["grad_norm"] == pytest.approx(single["grad_norm"], rel=1e-4)
    assert single["grad_norm"] > 0
    table = [line.split() for line in done.stdout.splitlines()]
    assert {row[0] for row in table if len(row) >= 12} >= set(results)  # a table row each
    goals = {g["goal"]: g for g in report["goals"]}
    ratio = goals["new-fsdp2 max rank peak / new peak"]
    peak = max(results[f"new-fsdp2/r{rank}"]["peak"] for rank in (0, 1))
    assert ratio["value"] == pytest.approx(peak / single["peak"]) and ratio["target"] == "<= 0.70"
    assert goals["new-fsdp2 grad norm vs new's (relative)"]["met"] is True
    assert "new-fsdp2 max rank peak / new peak" in done.stdout


def test_a_batch_that_does_not_split_evenly_is_one_line_naming_both():
    done = bench("--sequences", "3", "--cases", "new", "--nproc-per-node", "2", timeout=120)
    assert done.returncode == 2
    error = done.stderr.strip().splitlines()[-1]
    assert "--sequences 3" in error and "--nproc-per-node 2" in error
