"""How well the default model does on each task, greedy: where can learning start?

Runs ``llm-gym rollout``'s job (SmolLM2-135M-Instruct unless ``--model``) for N episodes per
(task, level, answer format) with greedy decoding and prints a Markdown table of success rate,
answer-format rate and mean reward. README's calibration table is its output.

    python scripts/calibrate.py --episodes 64 --max-new-tokens 128
    python scripts/calibrate.py --games --episodes 8 --max-new-tokens 48 --max-turns 8
    python scripts/calibrate.py --humaneval --episodes 164 --max-new-tokens 256
    python scripts/calibrate.py --ifeval --episodes 32 --max-new-tokens 128 --level 0 --level 1

``--games`` plays TextArena's single-player games instead (win rate, mean reward, turns per
episode, games lost to an invalid move); ``--humaneval`` HumanEval, greedy and with the python
tool (pass rate, mean share of tests passed, turns); ``--ifeval`` IFEval's levels (all six, or
each ``--level``): prompt-level accuracy (all constraints followed) and instruction-level
accuracy (the share followed; strictly, the mean reward), strict and loose, and the share of
responses cut at ``--max-new-tokens``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from llm_gym.run import Rollout, RolloutConfig
from llm_gym.tasks.ifeval import IFEVAL_LEVELS

# (label, env id, env arguments, answer format); level None is the task's default.
CASES = [
    ("ReasoningGym basic_arithmetic", "LLMChat-ReasoningGym-v0", {"level": 0}, "last_number"),
    ("ReasoningGym basic_arithmetic", "LLMChat-ReasoningGym-v0", {"level": 0}, "tags"),
    ("ReasoningGym basic_arithmetic", "LLMChat-ReasoningGym-v0", {"level": 1}, "last_number"),
    ("ReasoningGym basic_arithmetic", "LLMChat-ReasoningGym-v0", {"level": None}, "last_number"),
    (
        "ReasoningGym chain_sum",
        "LLMChat-ReasoningGym-v0",
        {"task": "chain_sum", "level": 0},
        "last_number",
    ),
    (
        "ReasoningGym leg_counting",
        "LLMChat-ReasoningGym-v0",
        {"task": "leg_counting", "level": 0},
        "last_number",
    ),
    (
        "ReasoningGym leg_counting",
        "LLMChat-ReasoningGym-v0",
        {"task": "leg_counting", "level": None},
        "last_number",
    ),
    ("Countdown", "LLMChat-Countdown-v0", {"level": 0}, "tags"),
    ("Countdown", "LLMChat-Countdown-v0", {"level": 0}, "boxed"),
    ("Countdown", "LLMChat-Countdown-v0", {"level": 4}, "tags"),
]

# One game per TextArena family that plays here alone (llm_gym.games.game_catalogue).
GAMES = [
    "GuessTheNumber-v0", "Mastermind-v0", "TowerOfHanoi-v0", "FrozenLake-v0",
    "Minesweeper-v0-small", "Sudoku-v0-very-easy", "Sokoban-v0", "Crosswords-v0", "Bandit-v0",
    "Blackjack-v0", "LightsOut-v0", "FifteenPuzzle-v0", "Secretary-v0", "Set-v0",
    "Countdown-v0", "Cryptarithm-v0", "LogicPuzzle-v0", "2048-v0-ultra-easy", "PegJump-v0",
    "RushHour-v0", "ThreeCardMonte-v0", "Slitherlink-v0",
]  # fmt: skip


def _rollout(args: argparse.Namespace, env_id: str, env_args: dict, **options: object) -> tuple:
    with tempfile.TemporaryDirectory() as out:
        config = RolloutConfig(
            env=env_id, env_args=env_args, num_envs=args.num_envs, episodes=args.episodes,
            model=args.model, max_new_tokens=args.max_new_tokens, temperature=0.0, seed=0,
            out=out, progress=False, **options,
        )  # fmt: skip
        start = time.perf_counter()
        summary = Rollout(config).run()
        records = [json.loads(line) for line in open(Path(out) / "episodes.jsonl")]
    return summary, records, time.perf_counter() - start


def games(args: argparse.Namespace) -> None:
    """The games table: one row per game of ``GAMES`` (or ``--only``)."""
    names = [g for g in GAMES if not args.only or any(text in g for text in args.only)]
    print("| game | win | mean reward | turns / episode | ended by an invalid move | seconds |")
    print("|---|---|---|---|---|---|")
    for game in names:
        env_args = {"game": game, "max_turns": args.max_turns}
        summary, records, seconds = _rollout(args, "LLMChat-TextArena-v0", env_args)
        invalid = sum(bool(r.get("invalid_move")) for r in records) / len(records)
        win, turns = summary.outcomes["win"], summary.turns_per_episode
        print(f"| {game} | {win:.3f} | {summary.mean_reward:.3f} | {turns:.2f} | "
              f"{invalid:.3f} | {seconds:.0f} |", flush=True)  # fmt: skip


def humaneval(args: argparse.Namespace) -> None:
    """HumanEval greedy, then with the python tool (``--max-turns`` turns)."""
    print("| HumanEval | pass rate | mean share of tests passed | turns / episode | seconds |")
    print("|---|---|---|---|---|")
    for label, options in (("greedy", {}), ("python tool", {"tools": ["python"]})):
        env_args = {"shuffle": False} | ({"max_turns": args.max_turns} if options else {})
        summary, _, seconds = _rollout(args, "LLMChat-HumanEval-v0", env_args, **options)
        print(f"| {label} | {summary.accuracy:.3f} | {summary.mean_reward:.3f} | "
              f"{summary.turns_per_episode:.2f} | {seconds:.0f} |", flush=True)  # fmt: skip


def ifeval(args: argparse.Namespace) -> None:
    """IFEval, one row per level (``--level``, or all of ``IFEVAL_LEVELS``)."""
    levels = args.level or range(len(IFEVAL_LEVELS))
    print("| IFEval level | prompt-level strict (success) | prompt-level loose | instruction-level "
          "strict (mean reward) | instruction-level loose | cut | seconds |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for level in levels:
        summary, records, seconds = _rollout(args, "LLMChat-IFEval-v0", {"level": level})
        loose = sum(bool(r["loose"]) for r in records) / len(records)
        loose_fraction = sum(r["loose_fraction"] for r in records) / len(records)
        cut = sum(r["num_tokens"] >= args.max_new_tokens for r in records) / len(records)
        print(f"| {level} | {summary.accuracy:.3f} | {loose:.3f} | {summary.mean_reward:.3f} | "
              f"{loose_fraction:.3f} | {cut:.2f} | {seconds:.0f} |", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--gsm8k-dir", default=None, help="also GSM8K test (a folder)")
    parser.add_argument("--math-dir", default=None, help="also MATH test (a folder)")
    parser.add_argument(
        "--only", action="append", default=[], help="run the cases whose label holds this text"
    )
    parser.add_argument("--games", action="store_true", help="TextArena's games instead")
    parser.add_argument("--humaneval", action="store_true", help="HumanEval instead")
    parser.add_argument("--ifeval", action="store_true", help="IFEval's levels instead")
    parser.add_argument(
        "--level", action="append", type=int, default=[], help="IFEval: this level (0-5)"
    )
    parser.add_argument("--max-turns", type=int, default=8, help="moves per game, tool turns")
    args = parser.parse_args()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; greedy, "
        f"{args.episodes} episodes, {args.max_new_tokens} new tokens at most\n"
    )
    if args.ifeval:
        return ifeval(args)
    if args.games or args.humaneval:
        return games(args) if args.games else humaneval(args)
    cases = list(CASES)
    if args.gsm8k_dir:
        cases += [
            ("GSM8K test", "LLMChat-GSM8K-v0", {"split": "test", "data_dir": args.gsm8k_dir}, f)
            for f in ("tags", "last_number")
        ]
    if args.math_dir:
        cases += [
            ("MATH test", "LLMChat-MATH-v0", {"split": "test", "data_dir": args.math_dir}, "boxed")
        ]
    if args.only:
        cases = [case for case in cases if any(text in case[0] for text in args.only)]
    print("| task | level | answer format | success | answer given | mean reward | seconds |")
    print("|---|---|---|---|---|---|---|")
    for label, env_id, env_args, answer_format in cases:
        env_args = dict(env_args)
        split, data_dir = env_args.pop("split", None), env_args.pop("data_dir", None)
        level = env_args.get("level", "-")
        with tempfile.TemporaryDirectory() as out:
            config = RolloutConfig(
                env=env_id, env_args=env_args, split=split, data_dir=data_dir,
                answer_format=answer_format, num_envs=args.num_envs, episodes=args.episodes,
                model=args.model, max_new_tokens=args.max_new_tokens, temperature=0.0,
                seed=0, out=out, progress=False,
            )  # fmt: skip
            start = time.perf_counter()
            summary = Rollout(config).run()
        level_name = "default" if level is None else level
        rate = "n/a" if summary.format_rate is None else f"{summary.format_rate:.3f}"
        print(f"| {label} | {level_name} | {answer_format} | {summary.accuracy:.3f} | "
              f"{rate} | {summary.mean_reward:.3f} | "
              f"{time.perf_counter() - start:.0f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
