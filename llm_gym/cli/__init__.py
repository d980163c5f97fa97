"""The ``llm-gym`` command (also ``python -m llm_gym``); each subcommand's help says what it
does. Bad input gets a one-line ``llm-gym: error: ...`` and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

import gymnasium as gym

import llm_gym
from llm_gym.cli._args import (
    Parser,
    add_config_options,
    check_env_args,
    check_flags,
    check_task_env,
    given_options,
    llm_gym_env_ids,
    make_config,
    parse_with_recipe,
    resume_from_flags,
    usage_error,
)
from llm_gym.cli._check_tasks import add_check_tasks, check_tasks
from llm_gym.cli._check_template import add_check_template, check_template
from llm_gym.cli._envs import envs_table
from llm_gym.cli._launch import LAUNCHED, launch, processes
from llm_gym.cli._rescore import add_rescore, rescore
from llm_gym.cli._servers import add_gateway, add_serve, gateway, serve
from llm_gym.options import number
from llm_gym.run.config import ProfileConfig, RolloutConfig
from llm_gym.run.signals import exit_code, interruptible, launcher_gone, watch_launcher
from llm_gym.train.config import GRPOConfig

# Nothing above imports torch: each command imports what it runs (``--help`` and ``envs``
# answer in well under a second).
__all__ = [
    "build_parser", "check_flags", "envs_table", "eval_line", "given_options", "llm_gym_env_ids",
    "main", "parse_with_recipe",
]  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    """The ``llm-gym`` parser with its subcommands."""
    parser = Parser(prog="llm-gym", description="Gymnasium environments for LLM RL.")
    parser.add_argument("--version", action="version", version=f"llm-gym {llm_gym.__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    _add_rollout(commands)
    _add_train(commands)
    _add_profile(commands)
    add_rescore(commands)
    add_serve(commands)
    add_gateway(commands)
    commands.add_parser(
        "envs",
        help="list the registered environments: task, spaces, where the data comes from",
        description="A table of the registered ids; makes no env and loads no data.",
    )
    add_check_template(commands)
    add_check_tasks(commands)
    return parser


def _add_rollout(commands: Any) -> None:
    parser = commands.add_parser(
        "rollout",
        help="run a model on a chat task; write episodes.jsonl, summary.json and a plot",
        description="Run a model on a registered chat task with the policy adapter and, given "
        "--ref-model, the KL reward wrapper.",
    )
    add_config_options(parser, RolloutConfig)
    parser.set_defaults(job=_prepare_rollout, run=_rollout, kept=_episodes_kept)


def _episodes_kept(out: str) -> str:
    return f"finished episodes are in {out}/episodes.jsonl"


def _prepare_rollout(config: RolloutConfig) -> Any:
    from llm_gym.run.rollout import Rollout

    return Rollout(config)


def _rollout(rollout: Any) -> int:
    summary = rollout.run()
    print(summary.table())
    print(f"wrote {rollout.out}/episodes.jsonl, summary.json, rollout.png")
    return 0


def _add_profile(commands: Any) -> None:
    parser = commands.add_parser(
        "profile",
        help="card a model on an env, level by level: greedy success, pass@1, pass@K",
        description="Answer each level's questions greedily once and K times at "
        "--temperature; write card.json and card.md (a row a level: greedy success, pass@1 "
        "and pass@K with their standard errors, reward, response tokens, truncated and "
        "answerless shares, minutes).",
    )
    add_config_options(parser, ProfileConfig)
    parser.set_defaults(job=_prepare_profile, run=_profile, kept=_nothing_kept)


def _nothing_kept(out: str) -> str:
    return f"a card is written only when every level is played; none was written in {out}"


def _prepare_profile(config: ProfileConfig) -> Any:
    from llm_gym.run.learning import Comparison
    from llm_gym.run.profile import Profile

    return Profile(config) if config.compare is None else Comparison(config.compare, config.out)


def _profile(profile: Any) -> int:
    from llm_gym.run.learning import Comparison
    from llm_gym.run.profile import CARD_FILE, CARD_TABLE_FILE, card_table

    if isinstance(profile, Comparison):
        print(profile.run())
        print(f"wrote {profile.out}/comparison.md, comparison.png")
        return 0
    card = profile.run()
    print(card_table(card))
    print(f"wrote {profile.out}/{CARD_FILE}, {CARD_TABLE_FILE}")
    return 0


def _add_train(commands: Any) -> None:
    parser = commands.add_parser(
        "train",
        help="train a model with GRPO on a chat task; write metrics, a plot and checkpoints",
        description="GRPO through the native vector env: groups of responses per question, "
        "group-relative advantages, the clipped surrogate, an optional KL penalty against the "
        "starting model (--kl-coef > 0).",
    )
    add_config_options(parser, GRPOConfig)
    add = parser.add_argument
    # Past one device: torchrun's own flags (docs/many-gpus.md).
    add("--nproc-per-node", type=number(int, 1), default=1, metavar="N",
        help="processes on this machine, one GPU each (gloo on the CPU): the update sharded "
        "with FSDP2, the groups split between them (default: %(default)s)")  # fmt: skip
    add("--nnodes", type=number(int, 1), default=1, metavar="M",
        help="machines in the run, each launching --nproc-per-node processes (default: "
        "%(default)s)")  # fmt: skip
    add("--node-rank", type=number(int, 0), default=0,
        help="this machine's rank among --nnodes, 0 to M-1 (default: %(default)s)")  # fmt: skip
    add("--master-addr", default=None, metavar="HOST",
        help="the address of --node-rank 0's machine, which every machine can reach "
        "(default: %(default)s, one machine, a local rendezvous)")  # fmt: skip
    add("--master-port", type=number(int, 1), default=None, metavar="PORT",
        help="a free port on --master-addr's machine, 29500 if not given; on one machine "
        "without --master-addr, the rendezvous's port on this one (default: %(default)s, a "
        "free one)")  # fmt: skip
    parser.set_defaults(job=_prepare_train, run=_train, kept=_iterations_kept)


def _iterations_kept(out: str) -> str:
    # Read from the folder: --resume is offered only where a checkpoint is there to resume.
    from llm_gym.train.run_folder import resume_hint

    return resume_hint(out)


def _prepare_train(config: GRPOConfig) -> Any:
    from llm_gym.train.grpo import GRPOTrainer

    return GRPOTrainer(config)


def eval_line(before: dict[str, Any] | None, after: dict[str, Any] | None) -> str | None:
    """The held-out greedy success before and after training, when both were measured (a
    resumed run, or one without evaluation, may lack either); else None."""
    if before is None or after is None:
        return None
    return (
        f"greedy success on held-out questions: {before['success']:.3f} before, "
        f"{after['success']:.3f} after"
    )


def _train(trainer: Any) -> int:
    from llm_gym.train.run_folder import METRICS_FILE, TRAINING_PLOT_FILE

    summary = trainer.train()
    if not trainer.lead:  # across processes, the first one says it
        return 0
    line = eval_line(summary["before"], summary["after"])
    if line is not None:
        print(line)
    if summary.get("parts"):
        means = ", ".join(f"{name} {mean:.3f}" for name, mean in summary["parts"].items())
        print(f"rubric parts (means, last iteration): {means}")
    for name, cost in (summary.get("judges") or {}).items():
        print(f"{name}: {cost['calls']} calls, {cost['tokens']} tokens, {cost['seconds']:.1f} s, "
              f"{cost['cache_hits']} cache hits, {cost['errors']} errors")  # fmt: skip
    print(f"wrote {trainer.out}/{METRICS_FILE}, {TRAINING_PLOT_FILE}, checkpoint-*/, summary.json")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``llm-gym`` with ``argv`` (default: the command line); the exit code."""
    try:
        return _main(argv)
    except KeyboardInterrupt as error:  # before the run began (its own are told in _run)
        print("llm-gym: interrupted before the run began; nothing was written", file=sys.stderr)
        return exit_code(error)


def _main(argv: Sequence[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    try:
        args, recipe = parse_with_recipe(parser, argv)  # --config's options, flags over them
    except ValueError as error:
        return usage_error(error)
    if args.command == "envs":
        print(envs_table())
        return 0
    if args.command == "check-template":
        return check_template(args)
    if args.command == "check-tasks":
        return check_tasks(args)
    if args.command == "rescore":
        return rescore(args)
    if args.command == "serve":
        return serve(args)
    if args.command == "gateway":
        return gateway(args)
    try:  # flags and values checked before anything heavy loads
        check_task_env(args.env, args.command)
        given = given_options(parser, argv) | recipe
        check_flags(args, given)
        if args.command == "train" and args.resume:  # the saved run, not the defaults
            config = resume_from_flags(args, given)
        else:
            config = make_config(args.config_class, args)
        check_env_args(config)
        world = processes(args, config)
    except (ValueError, TypeError, OSError, gym.error.Error) as error:
        return usage_error(error)
    if world > 1 and "WORLD_SIZE" not in os.environ:  # not yet under a launcher
        return launch(args, argv, lambda: args.kept(config.out))
    # Only a run needs torch and transformers (seconds to import).
    import torch
    import transformers

    # A SIGTERM stops a run as Ctrl-C does; a process torchrun started stops with it.
    with interruptible():
        watch_launcher()
        transformers.utils.logging.disable_progress_bar()  # the command draws its own bar
        if args.threads is not None:
            torch.set_num_threads(args.threads)
        return _run(args, config)


def _run(args: argparse.Namespace, config: Any) -> int:
    # The command's run, prepared (models loaded, envs made, folder claimed), then run; its
    # setup's and its end's errors in one line each, from the first process of several.
    from llm_gym.samplers import SamplerError
    from llm_gym.train.sharding import peer_lost

    # The first process of several says how the run ended; under llm-gym's launcher, the
    # launcher says it (it knows whether a process died), unless it is gone.
    def says() -> bool:
        lead = os.environ.get("RANK", "0") == "0"
        return lead and (LAUNCHED not in os.environ or launcher_gone())

    try:
        prepared = args.job(config)
    # Setup errors (bad ids, paths, data, values, a folder in use) are the user's to fix: one
    # line, exit 2.
    except (ValueError, TypeError, OSError, ImportError, gym.error.Error) as error:
        return usage_error(error)
    except SamplerError as error:  # the backend's server did not come up
        return usage_error(error, code=1)
    except KeyboardInterrupt as error:
        if says():
            kept = args.kept(config.out)
            print(f"llm-gym: interrupted while setting up; {kept}", file=sys.stderr)
        return exit_code(error)
    try:
        return args.run(prepared)
    except SamplerError as error:  # the server died or failed: what finished is on disk
        return usage_error(f"{error}; {args.kept(prepared.out)}", code=1)
    except OSError as error:  # a full disk, a read-only or vanished folder: one line
        return usage_error(f"{error}; {args.kept(prepared.out)}", code=1)
    except KeyboardInterrupt as error:  # what the run finished is on disk: say where
        if says():
            print(f"llm-gym: interrupted; {args.kept(prepared.out)}", file=sys.stderr)
        return exit_code(error)
    except RuntimeError as error:  # another process of the run died
        if not peer_lost(error):
            raise
        if says():
            said = str(error).strip().splitlines()[0]
            usage_error(f"another process of the run stopped ({said}); {args.kept(prepared.out)}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
