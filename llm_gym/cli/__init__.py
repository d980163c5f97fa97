"""The ``llm-gym`` command (also ``python -m llm_gym``).

- ``llm-gym rollout`` runs a model on a registered chat task and writes ``episodes.jsonl``,
  ``summary.json`` and a plot.
- ``llm-gym train`` trains a model with GRPO on a task and writes ``metrics.jsonl``, a plot,
  checkpoints and the greedy success on held-out questions before and after.
- ``llm-gym envs`` lists the registered environments.

Bad input gets a one-line ``llm-gym: error: ...`` and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import gymnasium as gym
import torch
import transformers

import llm_gym
from llm_gym.cli import rollout, train
from llm_gym.cli._args import EXIT_USAGE, Parser, check_task_env, llm_gym_env_ids, make_config

__all__ = ["main", "build_parser", "llm_gym_env_ids"]


def build_parser() -> argparse.ArgumentParser:
    """The ``llm-gym`` parser with its subcommands."""
    parser = Parser(prog="llm-gym", description="Gymnasium environments for LLM RL.")
    parser.add_argument("--version", action="version", version=f"llm-gym {llm_gym.__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    rollout.add_parser(commands)
    train.add_parser(commands)
    commands.add_parser("envs", help="list the registered environments and their spaces")
    return parser


def _envs() -> int:
    for env_id in llm_gym_env_ids():
        spec = gym.spec(env_id)
        vector = " (native vector env)" if spec.vector_entry_point else ""
        print(f"{env_id}{vector}\n  entry point: {spec.entry_point}")
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
    return args.run(prepared)


if __name__ == "__main__":
    sys.exit(main())
