"""The ``llm-gym`` command (also ``python -m llm_gym``); each subcommand's help says what it
does. Bad input gets a one-line ``llm-gym: error: ...`` and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import torch
import transformers

import llm_gym
from llm_gym.cli._args import (
    EXIT_USAGE,
    Parser,
    add_run_options,
    check_task_env,
    llm_gym_env_ids,
    make_config,
    number,
)
from llm_gym.run import Rollout, RolloutConfig
from llm_gym.train import GRPOConfig, GRPOTrainer
from llm_gym.train.grpo import METRICS_FILE, PLOT_FILE

__all__ = ["main", "build_parser", "llm_gym_env_ids"]


def build_parser() -> argparse.ArgumentParser:
    """The ``llm-gym`` parser with its subcommands."""
    parser = Parser(prog="llm-gym", description="Gymnasium environments for LLM RL.")
    parser.add_argument("--version", action="version", version=f"llm-gym {llm_gym.__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    _add_rollout(commands)
    _add_train(commands)
    commands.add_parser("envs", help="list the registered environments and their spaces")
    return parser


def _add_rollout(commands: Any) -> None:
    parser = commands.add_parser(
        "rollout",
        help="run a model on a chat task; write episodes.jsonl, summary.json and a plot",
        description="Run a model on a registered chat task with the policy adapter and, given "
        "--ref-model, the KL reward wrapper.",
    )
    add, defaults = add_run_options(parser, RolloutConfig)
    add("--split", default=None, help="data split of dataset tasks (GSM8K, MATH)")
    add("--data-dir", default=None, help="folder with the task's data files "
        "(GSM8K: train.jsonl/test.jsonl; default: $LLM_GYM_GSM8K_PATH)")  # fmt: skip
    add("--num-envs", type=number(int, 1), default=defaults.num_envs)
    add("--episodes", type=number(int, 1), default=None,
        help="episodes to run (default: one epoch of a dataset split, each question "
        "exactly once across the envs; 64 for procedural tasks)")  # fmt: skip
    add("--ref-model", default=None, help="reference model for the KL penalty ('default' or a "
        "folder); without it no KL is charged")  # fmt: skip
    parser.set_defaults(config=RolloutConfig, job=Rollout, run=_rollout,
                        kept="finished episodes are in {out}/episodes.jsonl")  # fmt: skip


def _rollout(rollout: Rollout) -> int:
    summary = rollout.run()
    print(summary.table())
    print(f"wrote {rollout.out}/episodes.jsonl, summary.json, rollout.png")
    return 0


def _add_train(commands: Any) -> None:
    parser = commands.add_parser(
        "train",
        help="train a model with GRPO on a chat task; write metrics, a plot and checkpoints",
        description="GRPO through the native vector env: groups of responses per question, "
        "group-relative advantages, the clipped surrogate, an optional KL penalty against the "
        "starting model (--kl-coef > 0).",
    )
    add, defaults = add_run_options(parser, GRPOConfig)
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
    add("--kl-target", type=number(float, 0.0, False), default=None,
        help="adaptive KL controller's target (default: a constant coefficient)")  # fmt: skip
    add("--eval-episodes", type=number(int, 0), default=defaults.eval_episodes,
        help="greedy episodes on held-out questions before and after (0: none)")  # fmt: skip
    add("--save-every", type=number(int, 1), default=defaults.save_every)
    add("--resume", action="store_true", help="continue the run in --out")
    parser.set_defaults(config=GRPOConfig, job=GRPOTrainer, run=_train,
                        kept=f"finished iterations are in {{out}}/{METRICS_FILE} "
                        "(--resume continues from the last checkpoint)")  # fmt: skip


def _train(trainer: GRPOTrainer) -> int:
    summary = trainer.train()
    before, after = summary["before"], summary["after"]
    if before is not None:
        print(f"greedy success on held-out questions: {before['success']:.3f} before, "
              f"{after['success']:.3f} after")  # fmt: skip
    print(f"wrote {trainer.out}/{METRICS_FILE}, {PLOT_FILE}, checkpoint-*/, summary.json")
    return 0


def _envs() -> int:
    for env_id in llm_gym_env_ids():
        spec = gym.spec(env_id)
        vector = " (native vector env)" if spec.vector_entry_point else ""
        made_by = spec.kwargs.get("task_factory", spec.entry_point)  # a task: its function
        print(f"{env_id}{vector}\n  entry point: {made_by}")
        try:
            env = gym.make(env_id, disable_env_checker=True)
        except Exception as error:  # noqa: BLE001 - spaces depend on arguments; say which
            print(f"  spaces depend on its arguments: {str(error).splitlines()[0]}")
            continue
        print(f"  observation space: {env.observation_space}")
        print(f"  action space: {env.action_space}")
        env.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``llm-gym`` with ``argv`` (default: the command line); the exit code."""
    args = build_parser().parse_args(argv)
    # The command draws its own progress bar; transformers' weight-loading bars are noise.
    transformers.utils.logging.disable_progress_bar()
    if args.command == "envs":
        return _envs()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:  # the run, prepared: models loaded, envs made, folder claimed
        check_task_env(args.env, args.command)
        prepared = args.job(make_config(args.config, args))
    # Setup errors (bad ids, paths, data, values) are the user's to fix: one line, exit 2.
    except (ValueError, TypeError, OSError, ImportError, gym.error.Error) as error:
        message = " ".join(str(error).split()) or type(error).__name__
        print(f"llm-gym: error: {message}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return args.run(prepared)
    except KeyboardInterrupt:  # what the run finished is on disk: say where; exit 130
        print(f"llm-gym: interrupted; {args.kept.format(out=prepared.out)}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
