"""How fast ``llm-gym`` answers: each command run as a whole process, the median seconds of
``--repeats`` runs, beside ``python -c "import torch"`` timed in the same run (the ratio says
how far a command is from paying for torch).

    python scripts/bench_cli.py --repeats 5

The commands run as ``python -m llm_gym``, which finds ``llm_gym`` in the working directory
first, then on ``PYTHONPATH``: to time another checkout, run from outside this one, e.g.
``cd /tmp && PYTHONPATH=/path/to/checkout python /path/to/bench_cli.py``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "llm-gym --help": ["-m", "llm_gym", "--help"],
    "llm-gym train --help": ["-m", "llm_gym", "train", "--help"],
    "llm-gym rollout --help": ["-m", "llm_gym", "rollout", "--help"],
    "llm-gym envs": ["-m", "llm_gym", "envs"],
}
BASELINE = ("import torch", ["-c", "import torch"])


def median_seconds(args: list[str], repeats: int) -> float:
    """The median wall-clock seconds of ``python *args`` over ``repeats`` runs (each must
    succeed; offline, as the Hub is unreachable here)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, *args], check=True, capture_output=True, env=env)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    """Time the commands and the baseline; print a row each."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs per command")
    repeats = parser.parse_args().repeats
    baseline = median_seconds(BASELINE[1], repeats)
    print(f"{'command':<24}  {'median s':>8}  {'/ import torch':>14}")
    for name, args in [*COMMANDS.items(), BASELINE]:
        seconds = baseline if args is BASELINE[1] else median_seconds(args, repeats)
        print(f"{name:<24}  {seconds:8.3f}  {seconds / baseline:14.2f}")


if __name__ == "__main__":
    main()
