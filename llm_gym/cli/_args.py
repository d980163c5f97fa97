"""What the ``llm-gym`` commands share: one-line errors, the run's options on a parser
(declared once, on ``RolloutConfig`` and ``GRPOConfig``: ``llm_gym.options``) and its YAML
recipe, which env ids a command can run, which options a command line gives, and the checks
of flag combinations the parser cannot see (a flag the task does not take, one that would be
ignored, a folder that is not a model), made before anything heavy loads. Each error names
the flag; ``main`` prints it on one line with exit code 2. Nothing here imports torch:
``llm-gym --help`` starts in well under a second."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import inspect
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import gymnasium as gym

from llm_gym.checks import forced_cpu_bf16
from llm_gym.envs.dataset import task_function
from llm_gym.options import add_options, flags, number, option_specs, read_recipe
from llm_gym.run.config import RunConfig
from llm_gym.train.config import RESUMABLE, GRPOConfig

__all__ = [
    "EXIT_USAGE",
    "Parser",
    "add_config_options",
    "check_env_args",
    "check_flags",
    "check_task_env",
    "dataset_env_ids",
    "given_options",
    "llm_gym_env_ids",
    "make_config",
    "parse_with_recipe",
    "resume_from_flags",
    "usage_error",
]

EXIT_USAGE = 2


# What gymnasium.make adds to an env's TypeError: its whole kwargs (a tokenizer's repr, pages
# long); the env's own message names the argument already.
_GYM_CREATOR = " was raised from the environment creator for "


def usage_error(error: Exception | str, code: int = EXIT_USAGE) -> int:
    """Print ``error`` as ``llm-gym``'s one line on stderr (without the kwargs gymnasium
    appends to an env's error); the exit ``code``."""
    message = " ".join(str(error).split(_GYM_CREATOR)[0].split()) or type(error).__name__
    print(f"llm-gym: error: {message}", file=sys.stderr)
    return code


class Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line (no usage block), exit code 2, and every
    option's default shown in its help."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", argparse.ArgumentDefaultsHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        """Exit with ``message`` on one line and code 2."""
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def llm_gym_env_ids() -> list[str]:
    """The environment ids llm_gym registers."""
    return sorted(
        env_id
        for env_id, spec in gym.registry.items()
        if isinstance(spec.entry_point, str) and spec.entry_point.startswith("llm_gym.")
    )


def check_task_env(env_id: str, command: str) -> None:
    """A clear error unless ``env_id`` is a task env (one with a native vector env)."""
    runnable = [i for i in llm_gym_env_ids() if gym.spec(i).vector_entry_point is not None]
    if env_id not in runnable:
        what = "is not a task env" if env_id in llm_gym_env_ids() else "is unknown"
        raise ValueError(
            f"env id {env_id!r} {what}; {command} runs the task envs: {', '.join(runnable)}"
        )


def check_env_args(config: RunConfig) -> None:
    """The run's env made once with its ``--env-arg`` values and tools, in history mode (no
    tokenizer, no model): a value the env refuses is its one line in a second or two, not
    after the model has loaded; and what a training run asks of its turns (``--gamma``,
    ``--branches``, vine) against how many it plays. Without either, nothing."""
    turns = isinstance(config, GRPOConfig) and (
        config.gamma < 1 or config.branches or config.advantage == "vine"
    )
    if not config.env_args and not turns:
        return
    env = gym.make(config.env, **config.env_args, **config.tool_options())
    try:
        if turns:
            base = env.unwrapped
            config.check_turns(base.max_turns != 1 or getattr(base, "toolbox", None) is not None)
    finally:
        env.close()


def add_config_options(parser: argparse.ArgumentParser, config: type) -> None:
    """A flag on ``parser`` for each option of ``config`` (``RolloutConfig``,
    ``GRPOConfig``: each declared once, there), then the command's own: ``--config`` (a YAML
    recipe of those options, which flags override, as ``trl grpo --config``) and
    ``--threads`` (the process's, not the run's)."""
    add_options(parser, config)
    parser.add_argument(
        "--config", dest="recipe", default=None, metavar="RECIPE.yaml",
        help="a YAML file of options by name (max_new_tokens: 64, env_args: {task: "
        "chain_sum}, ...), as trl's --config; flags given beside it win (default: "
        "%(default)s)",
    )  # fmt: skip
    parser.add_argument("--threads", type=number(int, 1), default=None, help="torch CPU "
        "threads (default: %(default)s, torch's); 1 is much faster when other processes "
        "load the cores")  # fmt: skip
    parser.set_defaults(config_class=config)


def parse_with_recipe(
    parser: argparse.ArgumentParser, argv: Sequence[str]
) -> tuple[argparse.Namespace, set[str]]:
    """``argv`` parsed by ``parser``, the options of its ``--config`` recipe taken as the
    subcommand's defaults (flags win); and the options the recipe sets."""
    args = parser.parse_args(list(argv))
    if getattr(args, "recipe", None) is None:
        return args, set()
    recipe = read_recipe(args.recipe, args.config_class)
    _subcommand(parser, args.command).set_defaults(**recipe)
    return parser.parse_args(list(argv)), set(recipe)


def _subcommand(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[name]
    raise ValueError(f"{parser.prog} has no subcommand {name!r}")


def make_config(cls: type, args: argparse.Namespace) -> Any:
    """``cls`` (a ``RunConfig``) from the parsed options: each flag's ``dest`` is its field."""
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})


def given_options(parser: argparse.ArgumentParser, argv: Sequence[str]) -> set[str]:
    """The ``dest`` of each option ``argv`` gives explicitly (a default value given counts),
    for ``parser`` (``build_parser()``: the subcommand's options; or any parser).

    A second parse of ``argv`` by a copy of ``parser`` whose defaults are all
    ``argparse.SUPPRESS``: only what ``argv`` holds lands in its namespace. ``argv`` must be
    one ``parser`` accepts."""
    quiet = copy.deepcopy(parser)
    options: set[str] = set()
    parsers = [quiet]
    while parsers:
        current = parsers.pop()
        for action in current._actions:
            action.default = argparse.SUPPRESS
            if isinstance(action, argparse._SubParsersAction):
                parsers.extend(action.choices.values())
            elif action.option_strings:
                options.add(action.dest)
    given, _ = quiet.parse_known_args(list(argv))
    return options & set(vars(given))


# -- checks of flag combinations ----------------------------------------------------

MODEL_FLAGS = {"model": "--model", "ref_model": "--ref-model", "judge": "--judge",
               "judge_tokenizer": "--judge-tokenizer"}  # fmt: skip
DATASET_FLAGS = {"split": "--split", "data_dir": "--data-dir"}


def _takes(env_id: str, argument: str) -> bool:
    function = task_function(env_id)
    return function is not None and argument in inspect.signature(function).parameters


def dataset_env_ids() -> list[str]:
    """The task env ids whose questions come from a dataset (their task takes ``data_dir``)."""
    return [i for i in llm_gym_env_ids() if i.startswith("LLMChat-") and _takes(i, "data_dir")]


def check_flags(args: argparse.Namespace, given: set[str]) -> None:
    """A ``ValueError`` naming the flag for a combination the run would fail on or ignore;
    ``given``: the options the command line gives (``given_options``)."""
    if "compare" in given:  # a comparison plays nothing: a flag of a card would be ignored
        named = flags(args.config_class) | {"threads": "--threads"}
        kept = {"compare", "out", "overwrite", "progress"}
        ignored = sorted(named.get(n, n) for n in given - kept)
        if ignored:
            raise ValueError(
                f"--compare plays nothing, it reads the run's folder: drop {', '.join(ignored)}"
            )
    forced_cpu_bf16()  # the environment's say on --dtype auto, checked before torch loads
    for dest, flag in DATASET_FLAGS.items():
        if dest in given and not _takes(args.env, dest):
            raise ValueError(
                f"{flag} applies to dataset tasks ({', '.join(dataset_env_ids())}); "
                f"{args.env} generates its questions"
            )
    if "answer_format" in given and not _takes(args.env, "answer_format"):
        raise ValueError(
            f"--answer-format applies to tasks that ask for an answer format; {args.env} "
            "reads answers in a format of its own (code, a game's moves)"
        )
    if {"rubric", "judge"} & given and task_function(args.env) is None:
        raise ValueError(
            f"--rubric and --judge apply to task envs (DatasetChatEnv's: llm-gym envs lists "
            f"their task); {args.env} scores its episodes its own way"
        )
    # rollout charges the KL against --ref-model only; train's kl_coef is its own penalty.
    if "kl_coef" in given and "ref_model" in vars(args) and args.ref_model is None:
        if args.kl_coef > 0:
            raise ValueError(
                f"--kl-coef {args.kl_coef} needs --ref-model (the KL is measured against "
                "it; without one no KL is charged): pass --ref-model default or a folder"
            )
    for dest, flag in MODEL_FLAGS.items():
        value = vars(args).get(dest)
        folder = Path(value).expanduser() if value not in (None, "default") else None
        # config.json: a model's; adapter_config.json: peft's, a LoRA run's checkpoint.
        made = ("config.json", "adapter_config.json")
        if folder is not None and folder.exists() and not any((folder / n).is_file() for n in made):
            raise ValueError(
                f"{flag} {value}: not a model folder (no config.json); expected 'default', "
                "a folder saved with save_pretrained (model and tokenizer) or a LoRA run's "
                "checkpoint"
            )


def resume_from_flags(args: argparse.Namespace, given: set[str]) -> GRPOConfig:
    """``train --resume``: the run config saved in ``--out`` with the ``given`` options that
    a resumed run may change (``RESUMABLE``); a given option that would change anything else
    is a ``ValueError`` naming its flag and what may change (a value equal to the saved one
    is fine)."""
    # The run folder's home imports torch (its checkpoints): only a resume loads it here.
    from llm_gym.train.run_folder import CONFIG_FILE, load_config, resumable_flags
    from llm_gym.train.run_folder import resumed_config as resume_saved

    if args.overwrite:  # checked first: there may be no run to load
        raise ValueError("resume and overwrite contradict each other: pass one")
    saved, parsed = load_config(args.out), make_config(GRPOConfig, args)
    named, changes = flags(GRPOConfig), {}
    # A value as its flag shows it: None where the flag names it otherwise ("auto").
    shown = {spec.name: spec.shown for spec in option_specs(GRPOConfig) if spec.shown}

    def told(name: str, value: object) -> str:
        return shown[name] if value is None and name in shown else repr(value)

    for name in sorted(given & set(named) - {"out"}):  # --threads: not the run's config
        value = getattr(parsed, name)
        if name in RESUMABLE:
            changes[name] = value
        elif value != getattr(saved, name):
            before = told(name, getattr(saved, name))
            raise ValueError(
                f"{named[name]} {told(name, value)} differs from the resumed run's {before} "
                f"({Path(args.out) / CONFIG_FILE}); with --resume only "
                f"{resumable_flags()} and --threads may change (or start over with --overwrite)"
            )
    return resume_saved(args.out, **changes)
