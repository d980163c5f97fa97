"""``llm-gym train``: GRPO on a task; metrics, their plot, checkpoints, before/after success."""

from __future__ import annotations

import sys
from typing import Any

from llm_gym.cli._args import add_task_options, number
from llm_gym.train import GRPOConfig, GRPOTrainer
from llm_gym.train.records import CHECKPOINT_DIR, METRICS_FILE, PLOT_FILE
from llm_gym.wrappers import ESTIMATORS

__all__ = ["add_parser", "run"]


def add_parser(commands: Any) -> None:
    """Add ``train`` and its options to the ``llm-gym`` subcommands."""
    parser = commands.add_parser(
        "train",
        help="train a model with GRPO on a chat task; write metrics, a plot and checkpoints",
        description="GRPO through the native vector env: groups of responses per question, "
        "group-relative advantages, the clipped surrogate, an optional KL penalty.",
    )
    defaults = GRPOConfig()
    add = parser.add_argument
    add_task_options(add, defaults)
    add("--iterations", type=number(int, 1), default=defaults.iterations)
    add("--groups", type=number(int, 1), default=defaults.groups,
        help="questions per iteration (default: %(default)s)")  # fmt: skip
    add("--group-size", type=number(int, 2), default=defaults.group_size,
        help="responses per question (default: %(default)s)")  # fmt: skip
    add("--learning-rate", type=number(float, 0.0, False), default=defaults.learning_rate)
    add("--update-epochs", type=number(int, 1), default=defaults.update_epochs)
    add("--minibatch-size", type=number(int, 1), default=defaults.minibatch_size,
        help="responses per forward in the update (memory, not the math)")  # fmt: skip
    add("--clip-coef", type=number(float, 0.0, False), default=defaults.clip_coef)
    add("--kl-coef", type=number(float, 0.0), default=defaults.kl_coef,
        help="KL penalty against the starting model; 0: none (default)")  # fmt: skip
    add("--kl-target", type=number(float, 0.0, False), default=None,
        help="adaptive KL controller's target (default: a constant coefficient)")  # fmt: skip
    add("--estimator", choices=sorted(ESTIMATORS), default=defaults.estimator)
    add("--eval-episodes", type=number(int, 0), default=defaults.eval_episodes,
        help="greedy episodes on held-out questions before and after (0: none)")  # fmt: skip
    add("--save-every", type=number(int, 1), default=defaults.save_every)
    add("--resume", action="store_true", help=f"continue from --out's {CHECKPOINT_DIR}/")
    parser.set_defaults(config=GRPOConfig, job=GRPOTrainer, run=run)


def run(trainer: GRPOTrainer) -> int:
    """Train and print the greedy success before and after; the exit code (130 after Ctrl-C)."""
    try:
        summary = trainer.train()
    except KeyboardInterrupt:
        print(
            f"llm-gym: interrupted; finished iterations are in {trainer.out / METRICS_FILE} "
            f"(--resume continues from the last checkpoint)",
            file=sys.stderr,
        )
        return 130
    before, after = summary["before"], summary["after"]
    if before is not None:
        print(f"greedy success on held-out questions: {before['success']:.3f} before, "
              f"{after['success']:.3f} after")  # fmt: skip
    print(f"wrote {trainer.out}/{METRICS_FILE}, {PLOT_FILE}, {CHECKPOINT_DIR}/, summary.json")
    return 0
