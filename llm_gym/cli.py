"""The ``llm-gym`` command (also ``python -m llm_gym``).

``llm-gym rollout`` runs a model on a registered chat task and writes ``episodes.jsonl``,
``summary.json`` and a plot; ``llm-gym envs`` lists the registered environments. Bad input
gets a one-line ``llm-gym: error: ...`` and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import gymnasium as gym
import torch
import transformers

import llm_gym
from llm_gym.rewards.answers import ANSWER_FORMATS
from llm_gym.runner import Rollout, RolloutConfig
from llm_gym.wrappers import ESTIMATORS

__all__ = ["main", "build_parser", "llm_gym_env_ids"]

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line (no usage block) and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _number(kind: type, low: float, inclusive: bool = True) -> Callable[[str], int | float]:
    relation = ">=" if inclusive else ">"

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {kind.__name__}, got {text!r}") from None
        if (isinstance(value, float) and not math.isfinite(value)) or (
            value < low if inclusive else value <= low
        ):
            raise argparse.ArgumentTypeError(f"expected a number {relation} {low}, got {text!r}")
        return value

    return parse


def _env_arg(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value  # a plain string, e.g. task=leg_counting


def llm_gym_env_ids() -> list[str]:
    """The environment ids llm_gym registers."""
    return sorted(
        env_id
        for env_id, spec in gym.registry.items()
        if isinstance(spec.entry_point, str) and spec.entry_point.startswith("llm_gym.")
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="llm-gym", description="Gymnasium environments for LLM RL.")
    parser.add_argument("--version", action="version", version=f"llm-gym {llm_gym.__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    rollout = commands.add_parser(
        "rollout",
        help="run a model on a chat task; write episodes.jsonl, summary.json and a plot",
        description="Run a model on a registered chat task with the policy adapter and, given "
        "--ref-model, the KL reward wrapper.",
    )
    defaults = RolloutConfig()
    add = rollout.add_argument
    add("--env", default=defaults.env, help="registered env id (default: %(default)s, "
        "procedural and offline; LLMChat-GSM8K-v0 with --split test for GSM8K)")  # fmt: skip
    add("--env-arg", action="append", default=[], type=_env_arg, metavar="KEY=VALUE",
        help="an env argument, repeatable; VALUE is read as JSON when it parses, e.g. "
        "task=leg_counting, level=2, task_config='{\"max_terms\": 3}'")  # fmt: skip
    add("--split", default=None, help="data split of dataset tasks (GSM8K, MATH)")
    add("--data-dir", default=None, help="folder with the task's data files "
        "(GSM8K: train.jsonl/test.jsonl; default: $LLM_GYM_GSM8K_PATH)")  # fmt: skip
    add("--answer-format", choices=ANSWER_FORMATS, default=None,
        help="the answer format the prompt asks for and the reward reads "
        "(default: the env's)")  # fmt: skip
    add("--curriculum", type=_number(int, 1), default=None, metavar="WINDOW",
        help="move the task's level with the success rate over WINDOW episodes (tasks with "
        "levels: Countdown, ReasoningGym)")  # fmt: skip
    add("--num-envs", type=_number(int, 1), default=defaults.num_envs)
    add("--episodes", type=_number(int, 1), default=None,
        help="episodes to run (default: one epoch of a dataset split, each question "
        "exactly once across the envs; 64 for procedural tasks)")  # fmt: skip
    add("--model", default=defaults.model, help="'default' (SmolLM2-135M-Instruct) or a folder")
    add("--ref-model", default=None, help="reference model for the KL penalty ('default' or a "
        "folder); without it no KL is charged")  # fmt: skip
    add("--kl-coef", type=_number(float, 0.0), default=defaults.kl_coef)
    add("--estimator", choices=sorted(ESTIMATORS), default=defaults.estimator)
    add("--max-new-tokens", type=_number(int, 1), default=defaults.max_new_tokens)
    add("--temperature", type=_number(float, 0.0), default=defaults.temperature,
        help="0 for greedy decoding (default: %(default)s)")  # fmt: skip
    add("--seed", type=_number(int, 0), default=defaults.seed)
    add("--threads", type=_number(int, 1), default=None, help="torch CPU threads (default: "
        "torch's); 1 is much faster when other processes load the cores")  # fmt: skip
    add("--out", default=defaults.out, help="run folder (default: %(default)s)")
    add("--overwrite", action="store_true", help="replace the episodes of an earlier run")
    add("--no-progress", action="store_true", help="no progress bar")

    commands.add_parser("envs", help="list the registered environments and their spaces")
    return parser


def _prepare(args: argparse.Namespace) -> Rollout:
    runnable = [i for i in llm_gym_env_ids() if gym.spec(i).vector_entry_point is not None]
    if args.env not in runnable:
        what = "is not a task env" if args.env in llm_gym_env_ids() else "is unknown"
        raise ValueError(
            f"env id {args.env!r} {what}; rollout runs the task envs: {', '.join(runnable)}"
        )
    config = RolloutConfig(
        env=args.env,
        env_args=dict(args.env_arg),
        split=args.split,
        data_dir=args.data_dir,
        answer_format=args.answer_format,
        curriculum=args.curriculum or 0,
        num_envs=args.num_envs,
        episodes=args.episodes,
        model=args.model,
        ref_model=args.ref_model,
        kl_coef=args.kl_coef,
        estimator=args.estimator,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        seed=args.seed,
        out=args.out,
        overwrite=args.overwrite,
        progress=not args.no_progress,
    )
    return Rollout(config)


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
    args = build_parser().parse_args(argv)
    # The command draws its own progress bar; transformers' weight-loading bars are noise.
    transformers.utils.logging.disable_progress_bar()
    if args.command == "envs":
        return _envs()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        rollout = _prepare(args)
    # Setup errors (bad ids, paths, data, values) are the user's to fix: one line, exit 2.
    except (ValueError, TypeError, OSError, ImportError, gym.error.Error) as error:
        message = " ".join(str(error).split()) or type(error).__name__
        print(f"llm-gym: error: {message}", file=sys.stderr)
        return EXIT_USAGE
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


if __name__ == "__main__":
    sys.exit(main())
