"""Cards for every registered id that runs offline (issue 74): ``llm-gym profile`` of the
default model on each, with the settings the docs train it with, into ``--out``/``NAME``
(a card already there is read, not made again), then the cards as Markdown, each with the
command that made it; ``--write-docs`` puts them into docs/envs/cards.md between its
markers.

    python scripts/cards.py --write-docs
    python scripts/cards.py --only chain_sum guess --episodes 8 --samples 2

Not carded: ``LLMChat-v0`` (no task reward), ``LLMChat-MATH-v0`` (its data comes from the Hub
or a folder this project does not ship), ``LLMChat-OpenEnv-v0`` (a server's),
``LLMChat-Verifiers-v0`` (a verifiers environment's), ``LLMToken-GSM8K-v0`` (a token a step,
not a task env).
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
PAGE = ROOT / "docs" / "envs" / "cards.md"
BEGIN, END = "<!-- cards begin -->", "<!-- cards end -->"

# name -> (title, profile's flags): the settings each env is trained with in the docs.
CARDS = {
    "chain_sum": ("reasoning-gym's chain_sum (the main job's task)",
                  ["--env-arg", "task=chain_sum", "--levels", "0,1,2", "--answer-format",
                   "last_number", "--max-new-tokens", "48"]),
    "countdown": ("Countdown", ["--env", "LLMChat-Countdown-v0", "--levels", "0,1,2",
                                "--max-new-tokens", "96"]),
    "gsm8k": ("GSM8K, its test split", ["--env", "LLMChat-GSM8K-v0", "--env-arg", "split=test",
                                        "--max-new-tokens", "256"]),
    "products": ("Products with the python tool",
                 ["--env", "LLMChat-Products-v0", "--levels", "0,1,2", "--tools", "python",
                  "--tool-format", "markdown", "--max-tool-calls", "2", "--max-new-tokens",
                  "64"]),
    "ifeval": ("IFEval's instructions", ["--env", "LLMChat-IFEval-v0", "--levels", "0,1,2",
                                         "--max-new-tokens", "128"]),
    "humaneval": ("HumanEval", ["--env", "LLMChat-HumanEval-v0", "--max-new-tokens", "256"]),
    "guess": ("TextArena's GuessTheNumber", ["--env", "LLMChat-TextArena-v0", "--env-arg",
                                             "game=GuessTheNumber-v0", "--max-new-tokens", "12"]),
    "terminal": ("The terminal world", ["--env", "LLMChat-Terminal-v0", "--levels",
                                        "0,1,2,3,4", "--max-new-tokens", "64"]),
}  # fmt: skip
# Fewer questions where an episode is many sandboxed turns (a level's 16 took ~17 min here).
EPISODES = {"terminal": 8}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("--only", nargs="+", choices=sorted(CARDS), default=sorted(CARDS))
    add("--episodes", type=int, default=16, help="questions a level (default: %(default)s)")
    add("--samples", type=int, default=4, help="K (default: %(default)s)")
    add("--seed", type=int, default=0)
    add("--threads", type=int, default=1, help="torch CPU threads (default: %(default)s)")
    add("--model", default="default")
    add("--out", default="runs/cards")
    add("--write-docs", action="store_true", help="put the cards into docs/envs/cards.md")
    return parser.parse_args(argv)


def command(name: str, args: argparse.Namespace) -> list[str]:
    """``llm-gym profile``'s arguments for card ``name`` (what the docs show), without the
    run's ``--threads`` and ``--no-progress``."""
    return [
        "profile", *CARDS[name][1], "--episodes", str(EPISODES.get(name, args.episodes)),
        "--samples", str(args.samples), "--seed", str(args.seed), "--model", args.model,
        "--out", f"{args.out}/{name}",
    ]  # fmt: skip


def card(name: str, args: argparse.Namespace) -> dict:
    """Card ``name``, made unless its folder holds it."""
    path = Path(args.out) / name / "card.json"
    if not path.exists():
        env = os.environ | {"HF_HUB_OFFLINE": "1"}
        cli = [sys.executable, "-m", "llm_gym", *command(name, args), "--threads",
               str(args.threads), "--no-progress"]  # fmt: skip
        done = subprocess.run(cli, env=env, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"card {name} failed:\n{done.stderr[-3000:]}")
    return json.loads(path.read_text())


def markdown(names: Sequence[str], args: argparse.Namespace) -> str:
    from llm_gym.run.profile import card_table

    parts = []
    for name in names:
        made = card(name, args)
        minutes = sum(row["minutes"] for row in made["levels"].values())
        model = "the default model" if made["model"] == "default" else f"`{made['model']}`"
        parts += [
            f"### {CARDS[name][0]}", "",
            f"`{made['env']}`: {model} sampling in {made['dtype']} at temperature "
            f"{made['temperature']}, seed {made['seed']}, llm_gym {made['llm_gym']}, reward "
            f"version {versions(made)}; {minutes:.0f} min on this project's 2-core CPU beside "
            "other runs:", "",
            "```bash", "llm-gym " + shlex.join(command(name, args)), "```", "",
            card_table(made), "",
        ]  # fmt: skip
    return "\n".join(parts)


def versions(made: dict) -> str:
    """The card's reward versions, in words: a terminal task's version ends in the digest of
    its tests, one per task, which the card sums up."""
    every = sorted({v for row in made["levels"].values() for v in row["reward_versions"]})
    own = sorted({v.split("+tests ")[0] for v in every})
    if not every:
        return "none stated"
    if own != every:  # per-task digests
        return f"`{', '.join(own)}` + the digest of each task's tests ({len(every)} tasks)"
    return ", ".join(f"`{v}`" for v in every)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    text = markdown(args.only, args)
    print(text)
    if args.write_docs:
        page = PAGE.read_text()
        head, rest = page.split(BEGIN)
        _, tail = rest.split(END)
        PAGE.write_text(f"{head}{BEGIN}\n\n{text}\n{END}{tail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
