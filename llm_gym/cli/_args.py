"""What the ``llm-gym`` commands share: one-line errors, number and KEY=VALUE parsing, the
task options, and which env ids a command can run."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from collections.abc import Callable
from typing import Any, NoReturn

import gymnasium as gym

from llm_gym.rewards.answers import ANSWER_FORMATS
from llm_gym.run.config import DTYPE_NAMES
from llm_gym.tools.calls import CALL_FORMATS
from llm_gym.wrappers.estimators import ESTIMATORS

EXIT_USAGE = 2
BUILTIN_TOOLS = ("python",)


class Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line (no usage block) and exit code 2."""

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


def env_arg(text: str) -> tuple[str, Any]:
    """``--env-arg KEY=VALUE``: the value as JSON when it parses, else the text."""
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
        "levels: Countdown, ReasoningGym)")  # fmt: skip
    add("--model", default=defaults.model, help="'default' (SmolLM2-135M-Instruct) or a folder")
    add("--max-new-tokens", type=number(int, 1), default=defaults.max_new_tokens)
    add("--temperature", type=number(float, 0.0), default=defaults.temperature,
        help="sampling temperature (default: %(default)s)")  # fmt: skip
    add("--kl-coef", type=number(float, 0.0), default=defaults.kl_coef,
        help="the KL penalty's coefficient (default: %(default)s; 0: none)")  # fmt: skip
    add("--estimator", choices=sorted(ESTIMATORS), default=defaults.estimator)
    add("--device", default=defaults.device,
        help="'auto' (CUDA when there is a GPU), 'cpu', 'cuda' or 'cuda:N'")  # fmt: skip
    add("--dtype", choices=DTYPE_NAMES, default=defaults.dtype,
        help="the models' dtype (default: %(default)s)")  # fmt: skip
    add("--seed", type=number(int, 0), default=defaults.seed)
    add("--threads", type=number(int, 1), default=None, help="torch CPU threads (default: "
        "torch's); 1 is much faster when other processes load the cores")  # fmt: skip
    add("--tools", type=tool_list, default=None, metavar="NAMES",
        help="tools the model may call between turns, e.g. 'python' (the sandboxed "
        "interpreter); episodes become multi-turn")  # fmt: skip
    add("--max-tool-calls", type=number(int, 1), default=defaults.max_tool_calls,
        help="tool calls per episode (default: %(default)s)")  # fmt: skip
    add("--tool-format", choices=CALL_FORMATS, default=defaults.tool_format,
        help="how the model calls tools: 'hermes' (<tool_call> JSON) or 'markdown' "
        "(```python blocks run by the python tool); default: %(default)s")  # fmt: skip
    add("--out", default=defaults.out, help="run folder (default: %(default)s)")
    add("--overwrite", action="store_true", help="replace an earlier run in --out")
    add("--no-progress", action="store_true", help="no progress bar")
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
    return cls(**values)
