"""Credit per turn against credit per episode, over seeds, on a game or a tool task.

``--task guess`` (default) trains the default model with ``llm-gym train`` on TextArena's
GuessTheNumber once with the episode's one advantage for every token (``--advantage grpo``,
on the game's reward: its moves paying the change in the game's progress,
``rewards=progress``, which add up to it) and once with each turn's own (``--advantage
turn-grpo --gamma 0.9``: each turn's discounted return against the same turn of its group's
games, on GEM's rewards for games: ``rewards=outcome`` with ``invalid_move_reward=-0.1``, the
winning move 1 and each move the game refuses -0.1; ``--credits`` may add ``rebn``, GEM's ReBN
on those rewards, and ``rebn-progress``, ReBN on the progress rewards). ``--task products``
does the same on ``LLMChat-Products-v0`` with the sandboxed python tool (markdown blocks, two
calls at most, sampled at temperature 0.5), per turn with ``tool_error_reward=-0.1`` on each
failed call; ``--task terminal`` on ``LLMChat-Terminal-v0`` at level 0 (the shell, sampled at
temperature 0.5), the same way. For each seed; then it prints a table of the greedy success
rate on held-out episodes before and after (the worst and the mean over the seeds, with its
standard error), the peak memory of each run, and plots the sampled success rate of every
iteration for each credit (``--plot``).

Each run goes into ``--out``/``<credit>-seed<N>``; a run with a finished summary there is
read, not run again, so the bench continues where an earlier call stopped; two benches over
different seeds may share ``--out`` (on 2 cores, ``--threads 1`` each).

    python scripts/bench_turn_credit.py --plot docs/assets/turn-credit.png
    python scripts/bench_turn_credit.py --credits episode turn-grpo rebn --report-only
    python scripts/bench_turn_credit.py --task products --threads 1 --seeds 0 1 &
    python scripts/bench_turn_credit.py --task products --threads 1 --seeds 2 3
    python scripts/bench_turn_credit.py --task products --report-only \
        --plot docs/assets/turn-credit-products.png
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# How each credit trains: the flags that differ. Credit per episode trains on the game's
# reward (its moves paying their change in progress, which add up to it); credit per turn on
# GEM's rewards for games (1 for the winning move, -0.1 for each move the game refuses, 0
# otherwise) with GEM's discount, by turn-grpo (each turn against the same turn of its group's
# other games). ReBN on the same rewards, and on the progress rewards, are there to compare:
# over the batch, a later refused move's return (-0.1) is above an earlier one's (-0.19), so
# games that are all refusals still train, towards refusing later.
PROGRESS = ["--env-arg", "rewards=progress"]
OUTCOME = ["--env-arg", "rewards=outcome", "--env-arg", "invalid_move_reward=-0.1"]
# On the tool task (``--task products``: the default model writes a Python block, the sandbox
# runs it, the next turn answers) a failed call costs its own turn -0.1 (``tool_error_reward``).
# At temperature 1 the default model sampled no success in a 16-iteration pilot (turn-grpo, seed
# 0; the penalty alone taught it to stop calling the tool); 32 episodes at 0.7 had 1 success,
# at 0.5 2, greedy 4: the tool task samples at 0.5, where the group can see success.
TOOL_ERRORS = ["--env-arg", "tool_error_reward=-0.1"]
# A tool task's credits (Products, the terminal): per episode on the task's reward, per turn and
# from the state with each failed call's -0.1 on its turn.
TOOL_CREDITS = {
    "episode": ["--advantage", "grpo"],
    "rebn": [*TOOL_ERRORS, "--advantage", "rebn", "--gamma", "0.9"],
    "turn-grpo": [*TOOL_ERRORS, "--advantage", "turn-grpo", "--gamma", "0.9"],
    "tree-grpo": [*TOOL_ERRORS, "--advantage", "tree-grpo", "--gamma", "0.9",
                  "--group-size", "6", "--branches", "4"],
    "vine": [*TOOL_ERRORS, "--advantage", "vine", "--gamma", "0.9", "--group-size", "4",
             "--vine-rollouts", "1"],
}  # fmt: skip
TASKS = {
    "guess": {
        "flags": ["--env", "LLMChat-TextArena-v0", "--env-arg", "game=GuessTheNumber-v0",
                  "--max-new-tokens", "12"],
        "credits": {
            "episode": [*PROGRESS, "--advantage", "grpo"],
            "rebn": [*OUTCOME, "--advantage", "rebn", "--gamma", "0.9"],
            "rebn-progress": [*PROGRESS, "--advantage", "rebn", "--gamma", "0.9"],
            "turn-grpo": [*OUTCOME, "--advantage", "turn-grpo", "--gamma", "0.9"],
            # Credit from the state (issue 72), at no more sampled tokens than 8 chains: 6
            # chains and 4 branches a group, each branch sampling only from where it left its
            # parent; VinePPO's values spend tokens on continuations, so fewer chains.
            "tree-grpo": [*OUTCOME, "--advantage", "tree-grpo", "--gamma", "0.9",
                          "--group-size", "6", "--branches", "4"],
            "vine": [*OUTCOME, "--advantage", "vine", "--gamma", "0.9", "--group-size", "4",
                     "--vine-rollouts", "1"],
        },
        "title": "GuessTheNumber",
        "iterations": 16,
    },
    "products": {
        "flags": ["--env", "LLMChat-Products-v0", "--tools", "python", "--tool-format",
                  "markdown", "--max-tool-calls", "2", "--max-new-tokens", "64",
                  "--temperature", "0.5"],
        "credits": TOOL_CREDITS,
        "title": "Products with the python tool",
        "iterations": 8,  # grpo's sampled success passed 0.6 by its fourth in a pilot
    },
    # The terminal world's level 0 (the command given as a block to run): the default model
    # samples 4 of 32 at temperature 0.5 (2 of 32 greedy), under the 0.2.
    "terminal": {
        "flags": ["--env", "LLMChat-Terminal-v0", "--env-arg", "level=0",
                  "--max-new-tokens", "64", "--temperature", "0.5"],
        "credits": TOOL_CREDITS,
        "title": "the terminal world, level 0",
        "iterations": 16,
    },
}  # fmt: skip
CREDITS = sorted({credit for task in TASKS.values() for credit in task["credits"]})


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("--task", choices=sorted(TASKS), default="guess")
    add("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    add("--credits", nargs="+", choices=CREDITS, default=["episode", "turn-grpo"])
    add(
        "--iterations",
        type=int,
        default=None,
        help="default: the task's (guess 16, products 8, terminal 16)",
    )
    add("--eval-episodes", type=int, default=32)
    add("--threads", type=int, default=None, help="torch CPU threads per run (default: torch's)")
    add("--out", default=None, help="the runs' folder (default: runs/turn-credit/TASK)")
    add("--plot", default=None, help="a PNG of the sampled success rate per iteration")
    add("--report-only", action="store_true", help="read the runs there are, start none")
    add(
        "--match-tokens",
        action="store_true",
        help="each credit but episode samples as many tokens as the same seed's episode run "
        "(--max-sampled-tokens; at most 3x the iterations), into <credit>-matched-seed<N>",
    )
    args = parser.parse_args(argv)
    unknown = [c for c in args.credits if c not in TASKS[args.task]["credits"]]
    if unknown:
        parser.error(
            f"--credits {' '.join(unknown)}: not a credit of --task {args.task} "
            f"(its credits: {', '.join(TASKS[args.task]['credits'])})"
        )
    args.out = args.out or f"runs/turn-credit/{args.task}"
    args.iterations = args.iterations or TASKS[args.task]["iterations"]
    return args


def command(
    args: argparse.Namespace, credit: str, seed: int, out: Path, budget: int | None = None
) -> list[str]:
    task = TASKS[args.task]
    # At a budget of sampled tokens the run stops there; the iterations are only a cap.
    iterations = args.iterations if budget is None else 3 * args.iterations
    limit = [] if budget is None else ["--max-sampled-tokens", str(budget)]
    return [
        sys.executable, "-m", "llm_gym", "train", *task["flags"], *limit,
        "--iterations", str(iterations), "--groups", "2", "--group-size", "8",
        "--eval-episodes", str(args.eval_episodes),
        "--seed", str(seed), "--save-every", str(iterations), "--no-progress",
        "--out", str(out), "--overwrite", *task["credits"][credit],
        *(["--threads", str(args.threads)] if args.threads else []),
    ]  # fmt: skip


def finished(out: Path) -> dict[str, Any] | None:
    summary = out / "summary.json"
    if not summary.exists():
        return None
    read = json.loads(summary.read_text())
    return None if read.get("interrupted") or read.get("after") is None else read


def run(args: argparse.Namespace, credit: str, seed: int) -> dict[str, Any] | None:
    """The run's summary, with its metrics rows and peak memory (GiB); trained first unless
    it is there already (or ``--report-only``)."""
    budget = None
    if args.match_tokens and credit != "episode":
        episode = finished(Path(args.out) / f"episode-seed{seed}")
        if episode is None:  # the budget is the episode run's: it runs first
            return None
        rows = (Path(args.out) / f"episode-seed{seed}" / "metrics.jsonl").read_text()
        budget = sum(json.loads(line)["sampled_tokens"] for line in rows.splitlines())
    out = Path(args.out) / (f"{credit}-seed{seed}" if budget is None else
                            f"{credit}-matched-seed{seed}")  # fmt: skip
    summary = finished(out)
    if summary is None and not args.report_only:
        out.parent.mkdir(parents=True, exist_ok=True)
        timed = ["/usr/bin/time", "-v", *command(args, credit, seed, out, budget)]
        done = subprocess.run(timed, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{credit} seed {seed} failed:\n{done.stderr[-3000:]}")
        peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
        (out / "peak_memory_gib.txt").write_text(f"{int(peak.group(1)) / 2**20:.2f}\n")
        summary = finished(out)
    if summary is None:
        return None
    memory = out / "peak_memory_gib.txt"
    summary["peak_gib"] = float(memory.read_text()) if memory.exists() else math.nan
    lines = (out / "metrics.jsonl").read_text().splitlines()
    summary["rows"] = [json.loads(line) for line in lines]
    return summary


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, math.nan
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return mean, math.sqrt(var / len(values))


def first_iteration(rows: Sequence[dict[str, Any]], rate: float) -> int | str:
    """The first iteration whose sampled episodes succeeded at least ``rate``; "-" for none."""
    return next((row["iteration"] for row in rows if row["success"] >= rate), "-")


def table(results: dict[str, dict[int, dict[str, Any]]]) -> str:
    lines = [
        "| credit | seeds | greedy success after, by seed | worst | mean (SE) | before (mean) "
        "| first iteration sampling half successes, by seed "
        "| sampled success over the iterations, mean (SE) "
        "| share of tool calls failing after iteration 0, mean (SE) | minutes (mean) "
        "| sampled tokens (thousands, mean) | iterations, by seed | peak memory (GiB, max) "
        "| dtype |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for credit, runs in results.items():
        if not runs:
            continue
        seeds = sorted(runs)
        after = [runs[s]["after"]["success"] for s in seeds]
        before = [runs[s]["before"]["success"] for s in seeds]
        mean, se = mean_se(after)
        minutes = sum(runs[s]["minutes_this_run"] for s in seeds) / len(seeds)
        tokens = [sum(r.get("sampled_tokens", math.nan) for r in runs[s]["rows"]) for s in seeds]
        peak = max(runs[s]["peak_gib"] for s in seeds)
        dtypes = sorted({runs[s]["dtype"] for s in seeds})
        half = [first_iteration(runs[s]["rows"], 0.5) for s in seeds]
        # How fast it learned, at the same compute: where every run ends at the ceiling, the
        # final rates tie and the area under the sampled curve can still tell them apart.
        sampled = mean_se([mean_se([row["success"] for row in runs[s]["rows"]])[0] for s in seeds])
        # What tool_error_reward is for: the calls that fail while the run learns.
        failing = [[row.get("failed_tool_share") for row in runs[s]["rows"][1:]] for s in seeds]
        failed = "-"
        if all(failing) and all(r is not None for rows in failing for r in rows):
            failed = "{:.3f} ({:.3f})".format(*mean_se([mean_se(f)[0] for f in failing]))
        lines.append(
            f"| {credit} | {', '.join(map(str, seeds))} | {' '.join(f'{a:.3f}' for a in after)} "
            f"| {min(after):.3f} | {mean:.3f} ({se:.3f}) | {sum(before) / len(before):.3f} "
            f"| {' '.join(map(str, half))} | {sampled[0]:.3f} ({sampled[1]:.3f}) | {failed} "
            f"| {minutes:.1f} | {sum(tokens) / len(tokens) / 1000:.1f} "
            f"| {' '.join(str(len(runs[s]['rows'])) for s in seeds)} | {peak:.1f} "
            f"| {', '.join(dtypes)} |"
        )
    return "\n".join(lines)


def plot(results: dict[str, dict[int, dict[str, Any]]], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4))
    colours = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")
    # Against the tokens sampled so far where the runs count them (runs of credits that
    # sample differently compare at equal budgets), else against the iteration.
    by_tokens = all("sampled_tokens" in r for runs in results.values() for s in runs
                    for r in runs[s]["rows"])  # fmt: skip
    for (credit, runs), colour in zip(results.items(), colours, strict=False):
        curves = [[row["success"] for row in runs[s]["rows"]] for s in sorted(runs)]
        spent = [[row["sampled_tokens"] / 1000 if by_tokens else 1 for row in runs[s]["rows"]]
                 for s in sorted(runs)]  # fmt: skip
        xs = [[sum(c[: i + 1]) - (0 if by_tokens else 1) for i in range(len(c))] for c in spent]
        for x, curve in zip(xs, curves, strict=True):
            axes.plot(x, curve, color=colour, alpha=0.25, linewidth=1)
        if curves:
            length = min(map(len, curves))
            mean = [sum(c[i] for c in curves) / len(curves) for i in range(length)]
            x = [sum(c[i] for c in xs) / len(xs) for i in range(length)]
            axes.plot(x, mean, color=colour, linewidth=2.5, label=f"{credit} ({len(curves)} seeds)")
    axes.set_xlabel("tokens sampled (thousands)" if by_tokens else "iteration")
    axes.set_ylabel("sampled success rate of the iteration's episodes")
    axes.set_title(f"{title}: credit per turn vs per episode")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    results: dict[str, dict[int, dict[str, Any]]] = {credit: {} for credit in args.credits}
    for seed in args.seeds:  # both credits of a seed before the next seed
        for credit in args.credits:
            summary = run(args, credit, seed)
            if summary is not None:
                results[credit][seed] = summary
                print(
                    f"{credit} seed {seed}: {summary['before']['success']:.3f} -> "
                    f"{summary['after']['success']:.3f}, {summary['minutes_this_run']:.1f} min, "
                    f"peak {summary['peak_gib']:.1f} GiB",
                    flush=True,
                )
    print(table(results))
    if args.plot:
        plot(results, args.plot, TASKS[args.task]["title"])
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
