"""What the ``llm-gym`` commands share: one-line errors, number and KEY=VALUE parsing, the
task options, which env ids a command can run, which options a command line gives, and the
checks of flag combinations the parser cannot see (a flag the task does not take, one that
would be ignored, a folder that is not a model), made before anything heavy loads. Each error
names the flag; ``main`` prints it on one line with exit code 2. Nothing here imports torch:
``llm-gym --help`` starts in well under a second."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import inspect
import json
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import gymnasium as gym
from gymnasium.envs.registration import load_env_creator

from llm_gym.rewards.answers import ANSWER_FORMATS
from llm_gym.run.config import BACKENDS, DTYPE_CHOICES
from llm_gym.tools.calls import TOOL_FORMATS
from llm_gym.train.config import CONFIG_FILE, RESUMABLE, GRPOConfig, load_config

__all__ = [
    "EXIT_USAGE",
    "ESTIMATOR_NAMES",
    "Parser",
    "add_run_options",
    "check_flags",
    "check_task_env",
    "dataset_env_ids",
    "env_arg",
    "given_options",
    "llm_gym_env_ids",
    "make_config",
    "number",
    "resumed_config",
    "task_function",
    "tool_list",
    "usage_error",
]

EXIT_USAGE = 2
BUILTIN_TOOLS = ("python",)
# llm_gym.wrappers.estimators.ESTIMATORS' keys (that package imports torch); a test holds
# the two equal.
ESTIMATOR_NAMES = ("k1", "k2", "k3")
_JSON_STARTS = ("{", "[", '"')  # an --env-arg VALUE meant as JSON


def usage_error(error: Exception | str, code: int = EXIT_USAGE) -> int:
    """Print ``error`` as ``llm-gym``'s one line on stderr; the exit ``code``."""
    message = " ".join(str(error).split()) or type(error).__name__
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


def number(kind: type, low: float, inclusive: bool = True) -> Callable[[str], int | float]:
    """argparse ``type``: a finite ``kind`` (int, float) ``>= low``, ``>`` unless ``inclusive``."""
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


def overlong(text: str) -> int | None:
    """``--overlong-cache``: an int >= 0, or ``auto`` (None: the trainer's rule).

    >>> overlong("16"), overlong("auto")
    (16, None)
    """
    return None if text == "auto" else number(int, 0)(text)


def env_arg(text: str) -> tuple[str, Any]:
    """``--env-arg KEY=VALUE``: the value as JSON when it parses, else the text; a value that
    starts as JSON (``{``, ``[``, ``"``) must parse."""
    key, sep, value = text.partition("=")
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError as error:
        if value.lstrip().startswith(_JSON_STARTS):
            raise argparse.ArgumentTypeError(
                f"{key}: {value!r} looks like JSON but does not parse: {error}"
            ) from None
        return key, value  # a plain string, e.g. task=leg_counting


def llm_gym_env_ids() -> list[str]:
    """The environment ids llm_gym registers."""
    return sorted(
        env_id
        for env_id, spec in gym.registry.items()
        if isinstance(spec.entry_point, str) and spec.entry_point.startswith("llm_gym.")
    )


def task_function(env_id: str) -> Callable[..., Any] | None:
    """The task function ``env_id`` makes its env with (``register_task``'s), imported but
    not called (no data loads); None for an env that is not a task's."""
    spec = gym.spec(env_id)
    if "task" in spec.kwargs:  # a token-level env over a task env (LLMToken-*)
        return task_function(spec.kwargs["task"])
    factory = spec.kwargs.get("task_factory")
    return load_env_creator(factory) if isinstance(factory, str) else factory


def check_task_env(env_id: str, command: str) -> None:
    """A clear error unless ``env_id`` is a task env (one with a native vector env)."""
    runnable = [i for i in llm_gym_env_ids() if gym.spec(i).vector_entry_point is not None]
    if env_id not in runnable:
        what = "is not a task env" if env_id in llm_gym_env_ids() else "is unknown"
        raise ValueError(
            f"env id {env_id!r} {what}; {command} runs the task envs: {', '.join(runnable)}"
        )


def add_run_options(parser: argparse.ArgumentParser, config: type) -> tuple[Callable, Any]:
    """The options of ``RunConfig`` (``rollout``'s and ``train``'s) on ``parser``; its
    ``add_argument`` and ``config``'s defaults, for the command's own options."""
    add, defaults = parser.add_argument, config()
    add("--env", default=defaults.env, help="registered env id (default: %(default)s, "
        "procedural and offline; LLMChat-GSM8K-v0 for GSM8K)")  # fmt: skip
    add("--env-arg", action="append", default=[], type=env_arg, metavar="KEY=VALUE",
        help="an env argument, repeatable; VALUE is read as JSON when it parses, e.g. "
        "task=leg_counting, level=2, task_config='{\"max_terms\": 3}'")  # fmt: skip
    add("--answer-format", choices=ANSWER_FORMATS, default=defaults.answer_format,
        help="the answer format the prompt asks for and the reward reads "
        "(default: %(default)s; None: the env's)")  # fmt: skip
    add("--curriculum", type=number(int, 1), default=None, metavar="WINDOW",
        help="move the task's level with the success rate over WINDOW episodes (tasks with "
        "levels: Countdown, ReasoningGym; default: %(default)s, a fixed level)")  # fmt: skip
    add("--model", default=defaults.model, help="'default' (SmolLM2-135M-Instruct) or a folder")
    add("--max-new-tokens", type=number(int, 1), default=defaults.max_new_tokens,
        help="tokens generated per assistant turn, at most")  # fmt: skip
    add("--temperature", type=number(float, 0.0), default=defaults.temperature,
        help="sampling temperature (default: %(default)s)")  # fmt: skip
    add("--kl-coef", type=number(float, 0.0), default=defaults.kl_coef,
        help="the KL penalty's coefficient (default: %(default)s; 0: none), against "
        "--ref-model in rollout, the starting model in train")  # fmt: skip
    add("--estimator", choices=ESTIMATOR_NAMES, default=defaults.estimator,
        help="the per-token KL estimator: k1 log(p/q), k2 its square / 2, k3 (q/p - 1) - "
        "log(q/p)")  # fmt: skip
    add("--device", default=defaults.device,
        help="'auto' (CUDA when there is a GPU), 'cpu', 'cuda' or 'cuda:N'")  # fmt: skip
    add("--dtype", choices=DTYPE_CHOICES, default=defaults.dtype,
        help="the dtype the models run in: sampling, the reference, a judge, a vLLM server "
        "('auto': bfloat16 where the device runs it fast, else float32; default: "
        "%(default)s); train's --precision says how the update computes")  # fmt: skip
    add("--backend", choices=BACKENDS, default=defaults.backend,
        help="what generates: transformers' generate here, a vLLM server llm_gym starts "
        "(needs scripts/setup_vllm.sh), or an OpenAI-compatible server at --base-url")  # fmt: skip
    add(
        "--base-url",
        default=None,
        metavar="URL",
        help="--backend openai: the server, e.g. http://127.0.0.1:8000 (default: %(default)s)",
    )
    add("--served-model", default=None, metavar="NAME", help="--backend openai: the model's "
        "name on the server (default: %(default)s, the server's only model)")  # fmt: skip
    add("--backend-arg", action="append", default=[], type=env_arg, metavar="KEY=VALUE",
        help="--backend vllm: a vLLM engine option, repeatable, e.g. max_model_len=4096, "
        "dtype=bfloat16 (the server's dtype, else --dtype's) (default: %(default)s)")  # fmt: skip
    add(
        "--vllm-python",
        default=None,
        metavar="PATH",
        help="--backend vllm: the vLLM "
        "environment's python (default: %(default)s, $LLM_GYM_VLLM_PYTHON, else "
        ".venv-vllm/bin/python)",
    )
    add("--async", dest="asynchronous", action="store_true",
        help="the asynchronous driver: each conversation steps as soon as its own response "
        "(or tool result) is back, none waits for the slowest")  # fmt: skip
    add("--ray", dest="ray_address", nargs="?", const="local", default=None, metavar="ADDRESS",
        help="run the env workers as Ray actors (implies --async): on the cluster at ADDRESS "
        "('auto', 'ray://host:10001'); alone, the one running here or a new one")  # fmt: skip
    add("--workers", type=number(int, 1), default=defaults.workers,
        help="--ray: env workers (Ray actors) that share the sub-envs (default: "
        "%(default)s)")  # fmt: skip
    add("--seed", type=number(int, 0), default=defaults.seed,
        help="seeds the question order, the sampling and the weights' init")  # fmt: skip
    add("--threads", type=number(int, 1), default=None, help="torch CPU threads (default: "
        "%(default)s, torch's); 1 is much faster when other processes load the cores")  # fmt: skip
    add("--tools", type=tool_list, default=None, metavar="NAMES",
        help="tools the model may call between turns, e.g. 'python' (the sandboxed "
        "interpreter); episodes become multi-turn")  # fmt: skip
    add("--max-tool-calls", type=number(int, 1), default=defaults.max_tool_calls,
        help="tool calls per episode (default: %(default)s)")  # fmt: skip
    add("--tool-format", choices=TOOL_FORMATS, default=defaults.tool_format,
        help="how the model calls tools: 'hermes' (<tool_call> JSON) or 'markdown' "
        "(```python blocks run by the python tool); default: %(default)s")  # fmt: skip
    add("--rubric", default=defaults.rubric, metavar="PARTS",
        help="the reward's parts, comma-separated PART[=WEIGHT]: 'task' (the task's own "
        "reward), 'judge' (an LLM judge of each response, in [0, 1]), 'group-judge' (train: "
        "an LLM judge ranks each group's responses); weight 1 unless given, 0 reports a part "
        "without paying it; the task's parts are reported even when not paid")  # fmt: skip
    add("--judge", default=None, metavar="MODEL|URL",
        help="the LLM judge of --rubric's judge parts: 'default', a model folder, or an "
        "OpenAI-compatible server's URL (default: %(default)s, none)")  # fmt: skip
    add("--judge-tokenizer", default=None, metavar="MODEL",
        help="--judge URL: the model whose chat template builds the judge's prompts "
        "(default: %(default)s, --model's)")  # fmt: skip
    add("--out", default=defaults.out, help="run folder (default: %(default)s)")
    add("--overwrite", action="store_true", help="replace an earlier run in --out")
    add("--no-progress", action="store_true", help="no progress bar")
    add("--report-to", default="none", metavar="NAMES",
        help="experiment trackers the run reports to as it runs (each offline unless told): none, "
        "all, or comma-separated tensorboard, wandb, trackio, mlflow (pip install "
        "'llm-gym[tracking]'; default: %(default)s)")  # fmt: skip
    return add, defaults


def tool_list(text: str) -> list[str]:
    """``--tools``: comma-separated built-in tool names."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in BUILTIN_TOOLS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of {list(BUILTIN_TOOLS)}, got {text!r}"
        )
    return names


def make_config(cls: type, args: argparse.Namespace) -> Any:
    """``cls`` (a ``RunConfig``) from the parsed options, field by field."""
    names = {f.name for f in dataclasses.fields(cls)}
    values = {name: value for name, value in vars(args).items() if name in names}
    values.update(
        env_args=dict(args.env_arg), curriculum=args.curriculum or 0, progress=not args.no_progress
    )
    values.update(backend_args=dict(args.backend_arg))
    return cls(**values)


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


def resumed_config(args: argparse.Namespace, given: set[str]) -> GRPOConfig:
    """``train --resume``: the run config saved in ``--out`` with the ``given`` flags that a
    resumed run may change (``RESUMABLE``); a given flag that would change anything else is a
    ``ValueError`` naming it (a flag equal to the saved value is fine)."""
    if args.overwrite:  # checked first: there may be no run to load
        raise ValueError("resume and overwrite contradict each other: pass one")
    saved, parsed = load_config(args.out), make_config(GRPOConfig, args)
    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    changes = {}
    for dest in sorted(given):
        renamed = {"env_arg": "env_args", "backend_arg": "backend_args", "no_progress": "progress"}
        name = renamed.get(dest, dest)
        if name not in fields or name == "out":  # --threads, --resume: not the run's config
            continue
        value = getattr(parsed, name)
        if name in RESUMABLE:
            changes[name] = value
        elif value != getattr(saved, name):
            raise ValueError(
                f"--{dest.replace('_', '-')} {value!r} differs from the resumed run's "
                f"{getattr(saved, name)!r} ({Path(args.out) / CONFIG_FILE}); with --resume only "
                "--iterations, --save-every, --keep-checkpoints, --eval-episodes, --device, "
                "--threads, --no-progress, --report-to, the update's memory (--minibatch-size, "
                "--max-tokens-per-microbatch, --gradient-checkpointing, --packing), what "
                "checkpoints hold (--save-optimizer, --save-dtype) and the --backend options may "
                "change "
                "(or start over with --overwrite)"
            )
    return GRPOConfig.resumed(args.out, **changes)
