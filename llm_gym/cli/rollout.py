"""``llm-gym rollout``: run a model on a task; write episodes, a summary and a plot."""

from __future__ import annotations

import sys
from typing import Any

from llm_gym.cli._args import add_task_options, number
from llm_gym.run import Rollout, RolloutConfig
from llm_gym.wrappers import ESTIMATORS

__all__ = ["add_parser", "run"]


def add_parser(commands: Any) -> None:
    """Add ``rollout`` and its options to the ``llm-gym`` subcommands."""
    parser = commands.add_parser(
        "rollout",
        help="run a model on a chat task; write episodes.jsonl, summary.json and a plot",
        description="Run a model on a registered chat task with the policy adapter and, given "
        "--ref-model, the KL reward wrapper.",
    )
    defaults = RolloutConfig()
    add = parser.add_argument
    add_task_options(add, defaults)
    add("--split", default=None, help="data split of dataset tasks (GSM8K, MATH)")
    add("--data-dir", default=None, help="folder with the task's data files "
        "(GSM8K: train.jsonl/test.jsonl; default: $LLM_GYM_GSM8K_PATH)")  # fmt: skip
    add("--num-envs", type=number(int, 1), default=defaults.num_envs)
    add("--episodes", type=number(int, 1), default=None,
        help="episodes to run (default: one epoch of a dataset split, each question "
        "exactly once across the envs; 64 for procedural tasks)")  # fmt: skip
    add("--ref-model", default=None, help="reference model for the KL penalty ('default' or a "
        "folder); without it no KL is charged")  # fmt: skip
    add("--kl-coef", type=number(float, 0.0), default=defaults.kl_coef)
    add("--estimator", choices=sorted(ESTIMATORS), default=defaults.estimator)
    parser.set_defaults(config=RolloutConfig, job=Rollout, run=run)


def run(rollout: Rollout) -> int:
    """Run it and print the summary; the exit code (130 after Ctrl-C)."""
    try:
        summary = rollout.run()
    except KeyboardInterrupt:
        print(
            f"llm-gym: interrupted; finished episodes are in {rollout.episodes_path}",
            file=sys.stderr,
        )
        return 130
    print(summary.table())
    print(f"wrote {rollout.out}/episodes.jsonl, summary.json, rollout.png")
    return 0
