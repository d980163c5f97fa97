"""The default model's success on ``LLMChat-Terminal-v0`` per level: 32 episodes a level,
greedy and sampled (temperature 0.5, as training samples), through ``llm-gym rollout``; a
table of the success rate (with its standard error), the calls an episode, the share of calls
that failed and minutes.

    python scripts/bench_terminal_levels.py --levels 0 1 2 3 4 --threads 1
    python scripts/bench_terminal_levels.py --levels 1 2 3 4 --temperatures 0
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--levels", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.5])
    parser.add_argument("--model", default="default")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", default="runs/terminal-levels")
    args = parser.parse_args()
    rows = ["| level | sampling | success (SE) | calls an episode | calls failing | minutes |",
            "|---|---|---|---|---|---|"]  # fmt: skip
    for level in args.levels:
        for temperature in args.temperatures:
            out = Path(args.out) / f"level{level}-t{temperature:g}"
            command = [
                sys.executable, "-m", "llm_gym", "rollout", "--env", "LLMChat-Terminal-v0",
                "--env-arg", f"level={level}", "--episodes", str(args.episodes),
                "--num-envs", "16", "--temperature", str(temperature), "--max-new-tokens", "64",
                "--kl-coef", "0", "--model", args.model, "--out", str(out), "--overwrite",
                "--no-progress", *(["--threads", str(args.threads)] if args.threads else []),
            ]  # fmt: skip
            began = time.perf_counter()
            subprocess.run(command, check=True, capture_output=True)
            minutes = (time.perf_counter() - began) / 60
            episodes = [json.loads(line) for line in (out / "episodes.jsonl").open()]
            wins = [float(bool(e.get("success"))) for e in episodes]
            rate = sum(wins) / len(wins)
            se = math.sqrt(rate * (1 - rate) / len(wins))
            calls = [e.get("num_tool_calls", 0) for e in episodes]
            failed = sum(e.get("failed_tool_calls", 0) for e in episodes) / max(sum(calls), 1)
            mode = "greedy" if temperature == 0 else f"sampled (T={temperature:g})"
            per = sum(calls) / len(calls)
            rows.append(f"| {level} | {mode} | {rate:.3f} ({se:.3f}) | {per:.2f} | {failed:.3f} "
                        f"| {minutes:.1f} |")  # fmt: skip
            print(rows[-1], flush=True)
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
