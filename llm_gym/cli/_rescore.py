"""``llm-gym rescore``: a run's stored episodes scored again by today's reward
(``llm_gym.run.rescore``); the report printed, the new scores written beside the old."""

from __future__ import annotations

import argparse
from typing import Any

from llm_gym.cli._args import usage_error

__all__ = ["add_rescore", "rescore"]


def add_rescore(commands: Any) -> None:
    """``llm-gym rescore``'s parser."""
    parser = commands.add_parser(
        "rescore",
        help="score a run's stored episodes again with today's reward; say what changed",
        description="Make the run's task again from its config and score each stored "
        "episode's final response against its item; write rescored.jsonl (each episode's old "
        "and new score and reward version) and rescore.json (the report) into RUN_DIR, whose "
        "episodes.jsonl is never rewritten. Prints how many changed, by how much, and which "
        "reward versions differ.",
    )
    parser.add_argument("run_dir", metavar="RUN_DIR",
                        help="a rollout's folder, or a training run's written with "
                        "--log-episodes")  # fmt: skip


def rescore(args: argparse.Namespace) -> int:
    """Rescore ``args.run_dir``; print the report; 0, or 2 with one line for bad input."""
    from llm_gym.run.rescore import RESCORE_FILE, RESCORED_FILE, report_text
    from llm_gym.run.rescore import rescore as rescore_run

    try:
        report = rescore_run(args.run_dir)
    except (ValueError, TypeError, KeyError, OSError) as error:  # OSError: busy, unwritable
        return usage_error(error)
    print(report_text(report))
    print(f"wrote {args.run_dir}/{RESCORED_FILE}, {RESCORE_FILE}")
    return 0
