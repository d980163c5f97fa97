"""Learning cards (issue 74): the default recipe's curve over four seeds on the main job's
task and on GuessTheNumber, written as ``llm_gym/run/learning_cards/NAME.json`` (what
``llm-gym profile --compare RUN_DIR`` holds a run against). A seed's run already finished in
its folder is read, not made again.

    python scripts/learning_cards.py chain_sum --seeds 0 1 2 3 --threads 1
    python scripts/learning_cards.py guess --seeds 0 1 2 3 --threads 1
    python scripts/learning_cards.py chain_sum --write-docs   # the card's table into the docs
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PAGE = ROOT / "docs" / "envs" / "cards.md"
BEGIN, END = "<!-- learning card begin -->", "<!-- learning card end -->"

# name -> (the command of one seed's run, with {seed} and {threads}; its run folder).
RUNS = {
    # The main job (README), less its checkpoint.
    "chain_sum": (
        "llm-gym train --env-arg task=chain_sum --eval-episodes 128 --seed {seed} "
        "--threads {threads} --no-progress --overwrite --out runs/learning/chain_sum/seed{seed}",
        "runs/learning/chain_sum/seed{seed}",
    ),
    # GRPO per episode on GuessTheNumber, as docs/forking.md measures it.
    "guess": (
        "python scripts/bench_turn_credit.py --task guess --credits episode --threads "
        "{threads} --seeds {seed}",
        "runs/turn-credit/guess/episode-seed{seed}",
    ),
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("name", choices=sorted(RUNS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--write-docs", action="store_true",
                        help="put the shipped cards' tables into docs/envs/cards.md")  # fmt: skip
    args = parser.parse_args(argv)
    if args.write_docs:
        return write_docs()
    from llm_gym.run.learning import learning_card

    template, folder = RUNS[args.name]
    runs = []
    for seed in args.seeds:
        run = ROOT / folder.format(seed=seed)
        if not (run / "summary.json").is_file():
            line = template.format(seed=seed, threads=args.threads)
            cli = shlex.split(line)
            cli = [sys.executable, "-m", "llm_gym", *cli[1:]] if cli[0] == "llm-gym" else [
                sys.executable, *cli[1:]]  # fmt: skip
            print(f"seed {seed}: {line}", flush=True)
            env = os.environ | {"HF_HUB_OFFLINE": "1"}
            subprocess.run(cli, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
        runs.append(run)
    # The command as run: the thread count too (it changes a bfloat16 sum's order).
    card = learning_card(runs, template.format(seed="SEED", threads=args.threads))
    out = ROOT / "llm_gym" / "run" / "learning_cards" / f"{args.name}.json"
    out.write_text(json.dumps(card, indent=1) + "\n")
    mean = card["mean"]
    print(f"wrote {out.relative_to(ROOT)}: {len(mean)} iterations, {card['metric']} "
          f"{mean[0]:.3f} -> {mean[-1]:.3f} (mean of seeds {card['seeds']})")  # fmt: skip
    return 0


def table(name: str, card: dict) -> str:
    """Card ``name`` in Markdown: what made it, then a row an iteration."""
    seeds = ", ".join(map(str, card["seeds"]))
    before = ", ".join(f"{v:.3f}" for v in card["greedy_before"])
    after = ", ".join(f"{v:.3f}" for v in card["greedy_after"])
    lines = [
        f"### {name}", "",
        f"`{card['command'].replace('SEED', 'S')}` for seeds {seeds}, sampling in "
        f"{card['dtype']}, llm_gym {card['llm_gym']}; greedy success on the held-out episodes "
        f"before, by seed: {before}; after: {after}.", "",
        f"| iteration | sampled {card['metric']}, mean (SE) | by seed |", "|---|---|---|",
    ]  # fmt: skip
    for i, (mean, se) in enumerate(zip(card["mean"], card["se"], strict=True)):
        by_seed = ", ".join(f"{curve[i]:.3f}" for curve in card["curves"])
        lines.append(f"| {i} | {mean:.3f} ({se:.3f}) | {by_seed} |")
    return "\n".join(lines)


def write_docs() -> int:
    from llm_gym.run.learning import LEARNING_CARDS, load_learning_card

    text = "\n\n".join(table(name, load_learning_card(name)) for name in LEARNING_CARDS)
    page = PAGE.read_text()
    head, rest = page.split(BEGIN)
    _, tail = rest.split(END)
    PAGE.write_text(f"{head}{BEGIN}\n\n{text}\n\n{END}{tail}")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
