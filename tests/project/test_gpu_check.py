"""scripts/gpu_check.sh names every GPU step it promises (its dry run, here without a GPU), and
scripts/bench_train_memory.py measures tokens per second on the CPU, with MFU n/a there."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import llm_gym

ROOT = Path(__file__).resolve().parents[2]


def dry_run() -> dict[str, str]:
    done = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--dry-run"], cwd=ROOT, capture_output=True,
        text=True, timeout=60, check=True,
    )  # fmt: skip
    steps = dict(re.findall(r"^\[(\S+)\] timeout \d+ s: (.*)$", done.stdout, re.M))
    assert steps, done.stdout
    return steps


def test_the_dry_run_lists_every_gpu_step_on_the_gpu():
    steps = dry_run()
    tests = steps["tests"]
    assert "pytest" in tests and "-k cuda" in tests and "-m ''" in tests
    assert "tests/train/test_train.py" in tests  # where DEVICES parametrizes a cuda device
    for bench in ("bench_kl", "bench_policy", "bench_env"):
        command = steps[bench]
        assert f"scripts/{bench}.py" in command
        assert "--device cuda" in command and "--dtype bfloat16" in command
    memory = {name: command for name, command in steps.items() if "train_memory" in name}
    assert len(memory) == 3
    for command in memory.values():
        assert "scripts/bench_train_memory.py" in command and "--device cuda" in command
        cases = re.search(r"--cases (\S+)", command).group(1).split(",")
        assert {"new", "new@bf16-mixed", "new-lora16", "trl", "trl-bf16"} <= set(cases)
    shapes = {
        (re.search(r"--model (\S+)", c).group(1), re.search(r"--sequences (\d+)", c).group(1),
         re.search(r"--seq-len (\d+)", c).group(1))
        for c in memory.values()
    }  # fmt: skip
    assert shapes == {("default", "16", "700"), ("SmolLM2-1.7B", "16", "700"),
                      ("default", "64", "2048")}  # fmt: skip
    main_job = steps["main_job"]  # README's first command, on the GPU, in its own folder
    assert "train --env-arg task=chain_sum --eval-episodes 128" in main_job
    assert "--device cuda" in main_job and "--out runs/demo" not in main_job
    assert "setup.sh" not in main_job


@pytest.mark.slow
def test_bench_train_memory_on_the_cpu_reports_tokens_per_second(tmp_path):
    out = tmp_path / "bench.json"
    # The script imports the llm_gym these tests import (the scripts' folder is its sys.path[0]).
    path = [str(Path(llm_gym.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join(filter(None, path))}
    done = subprocess.run(
        [sys.executable, "scripts/bench_train_memory.py", "--cases", "new,new-nopack",
         "--sequences", "8", "--lengths", "16-40", "--prompt-len", "8", "--threads", "1",
         "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    lengths = report["lengths"]
    assert len(lengths) == 8 and all(16 <= n <= 40 for n in lengths)
    results = {r["case"]: r for r in report["results"]}
    assert set(results) == {"new", "new-nopack"}
    for result in results.values():
        assert "error" not in result, result["error"]
        assert result["tokens"] == sum(lengths) and result["tokens_per_s"] > 0
        assert result["device"] == "cpu" and result["updates"] == 1
        assert result["mfu"] is None  # no peak known for a CPU
        assert result["params"] == result["trainable"] > 100_000_000
    rows = [line.split() for line in done.stdout.splitlines()]
    table = [row for row in rows if row and row[0] in results and len(row) >= 12]
    assert len(table) == 2 and all("n/a" in row for row in table)
    goal = [g for g in report["goals"] if g["goal"] == "new tok/s / new-nopack tok/s"]
    assert len(goal) == 1 and goal[0]["value"] > 0
