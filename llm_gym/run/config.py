"""The run configuration ``RolloutConfig`` (here) and ``GRPOConfig`` extend (so every function
of a run takes either). This module imports nothing heavy.

>>> RunConfig(max_new_tokens=0)
Traceback (most recent call last):
...
ValueError: max_new_tokens must be an int >= 1, got 0
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Any

from llm_gym.options import check_options, number, option, redeclare
from llm_gym.rewards.answers import ANSWER_FORMATS
from llm_gym.run.budget import MAX_ENVS, check_count
from llm_gym.run.trackers import check_report_to, report_to
from llm_gym.tools.calls import TOOL_FORMATS

__all__ = [
    "BACKENDS", "BUILTIN_TOOLS", "DTYPE_CHOICES", "DTYPE_NAMES", "ESTIMATOR_NAMES",
    "RUBRIC_PARTS", "ProfileConfig", "RolloutConfig", "RunConfig", "is_url", "level_list",
    "rubric_weights", "tool_list",
]  # fmt: skip

DTYPE_NAMES = ("bfloat16", "float16", "float32")
# --dtype: a name, or "auto": bfloat16 where the device runs it fast, else float32
# (llm_gym.lm.precision).
DTYPE_CHOICES = ("auto", *DTYPE_NAMES)
# What generates: transformers' generate in this process, a vLLM server llm_gym starts, or an
# OpenAI-compatible server the user runs (docs/policies.md, "Generation backends").
BACKENDS = ("transformers", "vllm", "openai")
_AT_ONCE = "sub-envs a run steps at once"
# The parts ``--rubric`` composes the reward of (docs/rubrics.md, "In the commands"): the
# task's own reward, an LLM judge of each response, an LLM judge of each GRPO group.
RUBRIC_PARTS = ("task", "judge", "group-judge")
JUDGE_PARTS = ("judge", "group-judge")
# llm_gym.wrappers.estimators.ESTIMATORS' keys (that package imports torch); a test holds
# the two equal.
ESTIMATOR_NAMES = ("k1", "k2", "k3")
BUILTIN_TOOLS = ("python",)  # what --tools can name


def tool_list(text: str) -> list[str]:
    """``--tools``: comma-separated built-in tool names.

    >>> tool_list("python")
    ['python']
    """
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in BUILTIN_TOOLS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of {list(BUILTIN_TOOLS)}, got {text!r}"
        )
    return names


def level_list(text: str) -> list[int]:
    """``--levels``: comma-separated levels, each an int >= 0, none twice.

    >>> level_list("0,1, 2")
    [0, 1, 2]
    """
    try:
        levels = [int(part) for part in text.split(",")]
    except ValueError:
        levels = []
    if not levels or min(levels) < 0 or len(set(levels)) < len(levels):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated levels, each an int >= 0, none twice; got {text!r}"
        )
    return levels


def is_url(text: str | None) -> bool:
    """Whether ``text`` names a server (``http://``, ``https://``) rather than a model."""
    return isinstance(text, str) and text.startswith(("http://", "https://"))


def rubric_weights(spec: str) -> dict[str, float]:
    """``--rubric``: comma-separated ``PART[=WEIGHT]`` of ``RUBRIC_PARTS`` (weight 1 when
    omitted; 0: reported, not paid) as ``{part: weight}``.

    >>> rubric_weights("task,judge=0.5")
    {'task': 1.0, 'judge': 0.5}
    >>> rubric_weights("judge=-1")
    Traceback (most recent call last):
    ...
    ValueError: rubric: judge's weight must be a finite number >= 0, got '-1'
    """
    weights: dict[str, float] = {}
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"rubric must name parts of {list(RUBRIC_PARTS)}, got {spec!r}")
    for entry in spec.split(","):
        name, _, text = (piece.strip() for piece in entry.partition("="))
        if name not in RUBRIC_PARTS:
            raise ValueError(
                f"rubric: expected PART[=WEIGHT] with PART one of {list(RUBRIC_PARTS)}, "
                f"got {entry.strip()!r}"
            )
        if name in weights:
            raise ValueError(f"rubric names {name!r} twice: {spec!r}")
        try:
            weight = float(text) if text else 1.0
        except ValueError:
            weight = math.nan
        if not math.isfinite(weight) or weight < 0:
            raise ValueError(f"rubric: {name}'s weight must be a finite number >= 0, got {text!r}")
        weights[name] = weight
    return weights


@dataclass
class RunConfig:
    """A model on a task: what rollout and training share (their common options)."""

    env: str = option(
        "LLMChat-ReasoningGym-v0",  # procedural and offline: runs anywhere
        help="registered env id (default: %(default)s, procedural and offline; "
        "LLMChat-GSM8K-v0 for GSM8K)",
    )
    env_args: dict[str, Any] = option(
        default_factory=dict, flag="--env-arg",
        help="an env argument, repeatable; VALUE is read as JSON when it parses, e.g. "
        "task=leg_counting, level=2, task_config='{\"max_terms\": 3}'",
    )  # fmt: skip
    answer_format: str | None = option(
        None, choices=ANSWER_FORMATS,
        help="the answer format the prompt asks for and the reward reads "
        "(default: %(default)s; None: the env's)",
    )  # fmt: skip
    # 0 (off) is the library's; the flag takes a window of 1 or more.
    curriculum: int = option(
        0, low=0, parse=number(int, 1), metavar="WINDOW",
        help="move the task's level with the success rate over WINDOW episodes (tasks with "
        "levels: Countdown, ReasoningGym; default: %(default)s, a fixed level)",
    )  # fmt: skip
    tools: list[str] | None = option(
        None, parse=tool_list, metavar="NAMES",
        help="tools the model may call between turns, e.g. 'python' (the sandboxed "
        "interpreter); episodes become multi-turn",
    )  # fmt: skip
    max_tool_calls: int = option(4, low=1, help="tool calls per episode (default: %(default)s)")
    tool_format: str = option(
        "hermes", choices=TOOL_FORMATS,
        help="how the model calls tools: 'hermes' (<tool_call> JSON) or 'markdown' "
        "(```python blocks run by the python tool); default: %(default)s",
    )  # fmt: skip
    model: str = option("default", help="'default' (SmolLM2-135M-Instruct) or a folder")
    max_new_tokens: int = option(256, low=1, help="tokens generated per assistant turn, at most")
    temperature: float = option(0.7, low=0, help="sampling temperature (default: %(default)s)")
    kl_coef: float = option(
        0.05, low=0,
        help="the KL penalty's coefficient (default: %(default)s; 0: none), against "
        "--ref-model in rollout, the starting model in train",
    )  # fmt: skip
    estimator: str = option(
        "k1", choices=ESTIMATOR_NAMES,
        help="the per-token KL estimator: k1 log(p/q), k2 its square / 2, k3 (q/p - 1) - "
        "log(q/p)",
    )  # fmt: skip
    device: str = option(
        "auto", resumable=True,
        help="'auto' (CUDA when there is a GPU), 'cpu', 'cuda' or 'cuda:N'",
    )  # fmt: skip
    dtype: str = option(
        "auto", choices=DTYPE_CHOICES,
        help="the dtype the models run in: sampling, the reference, a judge, a vLLM server "
        "('auto': bfloat16 where the device runs it fast, else float32; default: "
        "%(default)s); train's --precision says how the update computes",
    )  # fmt: skip
    seed: int = option(
        0, low=0, help="seeds the question order, the sampling and the weights' init"
    )
    # How the samples are drawn, not what is learned from them: a resume may change these.
    backend: str = option(
        "transformers", choices=BACKENDS, resumable=True,
        help="what generates: transformers' generate here, a vLLM server llm_gym starts "
        "(needs scripts/setup_vllm.sh), or an OpenAI-compatible server at --base-url",
    )  # fmt: skip
    base_url: str | None = option(
        None, metavar="URL", resumable=True,
        help="--backend openai: the server, e.g. http://127.0.0.1:8000 (default: %(default)s)",
    )  # fmt: skip
    served_model: str | None = option(
        None, metavar="NAME", resumable=True,
        help="--backend openai: the model's name on the server (default: %(default)s, the "
        "server's only model)",
    )  # fmt: skip
    backend_args: dict[str, Any] = option(
        default_factory=dict, flag="--backend-arg", resumable=True,
        help="--backend vllm: a vLLM engine option, repeatable, e.g. max_model_len=4096, "
        "dtype=bfloat16 (the server's dtype, else --dtype's) (default: %(default)s)",
    )  # fmt: skip
    vllm_python: str | None = option(
        None, metavar="PATH", resumable=True,
        help="--backend vllm: the vLLM environment's python (default: %(default)s, "
        "$LLM_GYM_VLLM_PYTHON, else .venv-vllm/bin/python)",
    )  # fmt: skip
    # The asynchronous driver (llm_gym.episodes.AsyncEpisodes); with ray_address its env
    # workers are Ray actors ("local": the cluster running here, else a new one).
    asynchronous: bool = option(
        False, flag="--async",
        help="the asynchronous driver: each conversation steps as soon as its own response "
        "(or tool result) is back, none waits for the slowest",
    )  # fmt: skip
    ray_address: str | None = option(
        None, flag="--ray", const="local", metavar="ADDRESS", resumable=True,
        help="run the env workers as Ray actors (implies --async): on the cluster at ADDRESS "
        "('auto', 'ray://host:10001'); alone, the one running here or a new one",
    )  # fmt: skip
    workers: int = option(
        1, low=1, resumable=True,
        help="--ray: env workers (Ray actors) that share the sub-envs (default: %(default)s)",
    )  # fmt: skip
    rubric: str = option(
        "task", metavar="PARTS",
        help="the reward's parts, comma-separated PART[=WEIGHT]: 'task' (the task's own "
        "reward), 'judge' (an LLM judge of each response, in [0, 1]), 'group-judge' (train: "
        "an LLM judge ranks each group's responses); weight 1 unless given, 0 reports a part "
        "without paying it; the task's parts are reported even when not paid",
    )  # fmt: skip
    judge: str | None = option(
        None, metavar="MODEL|URL",
        help="the LLM judge of --rubric's judge parts: 'default', a model folder, or an "
        "OpenAI-compatible server's URL (default: %(default)s, none)",
    )  # fmt: skip
    judge_tokenizer: str | None = option(
        None, metavar="MODEL",
        help="--judge URL: the model whose chat template builds the judge's prompts "
        "(default: %(default)s, --model's)",
    )  # fmt: skip
    out: str = option("runs/rollout", resumable=True, help="run folder (default: %(default)s)")
    overwrite: bool = option(False, resumable=True, help="replace an earlier run in --out")
    progress: bool = option(True, flag="--no-progress", resumable=True, help="no progress bar")
    # A list of names once checked.
    report_to: str | list[str] = option(
        "none", metavar="NAMES", resumable=True,
        help="experiment trackers the run reports to as it runs (each offline unless told): "
        "none, all, or comma-separated tensorboard, wandb, trackio, mlflow (pip install "
        "'llm-gym[tracking]'; default: %(default)s)",
    )  # fmt: skip

    def __post_init__(self) -> None:
        if isinstance(self.report_to, str):
            self.report_to = report_to(self.report_to)
        check_report_to(self.report_to)
        check_options(self)
        if (self.backend == "openai") != (self.base_url is not None):
            raise ValueError(
                "base_url (--base-url) names the server of backend 'openai' and only that: got "
                f"backend={self.backend!r} with base_url={self.base_url!r}"
            )
        if self.ray_address is not None:
            self.asynchronous = True  # Ray's env workers are the asynchronous driver's
        if self.workers > 1 and self.ray_address is None:
            raise ValueError(
                f"workers={self.workers} (--workers) are Ray actors: pass ray_address (--ray)"
            )
        self._check_rubric()
        if self.backend_args and self.backend != "vllm":
            raise ValueError(
                f"backend_args (--backend-arg) are vLLM's engine options, for backend 'vllm'; "
                f"got {sorted(self.backend_args)} with backend={self.backend!r}"
            )

    def _check_rubric(self) -> None:
        judged = [name for name in rubric_weights(self.rubric) if name in JUDGE_PARTS]
        if judged and self.judge is None:
            raise ValueError(
                f"rubric (--rubric) part {judged[0]!r} asks an LLM judge: pass judge (--judge "
                "'default', a model folder or a server's URL)"
            )
        if self.judge is not None and not judged:
            raise ValueError(
                f"judge (--judge) {self.judge!r} is asked only by a judge part of rubric "
                f"(--rubric), e.g. 'task,judge=0.5'; got rubric={self.rubric!r}"
            )
        if self.judge_tokenizer is not None and not is_url(self.judge):
            raise ValueError(
                "judge_tokenizer (--judge-tokenizer) is for a judge served at a URL (--judge "
                f"http://...); a judge model brings its own, got judge={self.judge!r}"
            )
        if self.judge is not None and self.ray_address is not None:
            raise ValueError(
                "an LLM judge (--judge) is not supported with Ray's env workers (--ray) yet: "
                "drop one"
            )
        if "group-judge" in judged and self.asynchronous:
            raise ValueError(
                "rubric part 'group-judge' sees a GRPO group's responses together, which the "
                "asynchronous driver (--async) steps apart: drop one"
            )

    def tool_options(self) -> dict[str, Any]:
        """The env's tool arguments (none without tools)."""
        if not self.tools:
            return {}
        return {
            "tools": list(self.tools),
            "max_tool_calls": self.max_tool_calls,
            "tool_format": self.tool_format,
        }


@dataclass
class RolloutConfig(RunConfig):
    """``llm-gym rollout``'s options: the run (``RunConfig``) and its episodes; the KL penalty
    is charged against ``ref_model`` (without one, none)."""

    split: str | None = option(
        None,
        help="data split of dataset tasks (GSM8K, MATH; default: %(default)s, the task's: train)",
    )
    data_dir: str | None = option(
        None,
        help="folder with a dataset task's data files (GSM8K: train.jsonl/test.jsonl; "
        "default: %(default)s, $LLM_GYM_GSM8K_PATH or $LLM_GYM_MATH_PATH, else the Hub)",
    )
    num_envs: int = option(8, low=1, help="envs stepped together, one batched generation a step")
    episodes: int | None = option(
        None, low=1,
        help="episodes to run (default: %(default)s, one epoch of a dataset split, each "
        "question exactly once across the envs; 64 for procedural tasks)",
    )  # fmt: skip
    ref_model: str | None = option(
        None,
        help="reference model for the KL penalty ('default' or a folder; default: "
        "%(default)s, no KL charged)",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        check_count("num_envs", "--num-envs", self.num_envs, MAX_ENVS, _AT_ONCE)
        if "group-judge" in rubric_weights(self.rubric):
            raise ValueError(
                "rubric part 'group-judge' ranks a GRPO group's responses: train has groups "
                "(llm-gym train --rubric ...), rollout does not; use 'judge' here"
            )


@dataclass
class ProfileConfig(RunConfig):
    """``llm-gym profile``'s options: the run (``RunConfig``; ``temperature`` is the
    samples') and what its card measures: ``episodes`` questions a level, each answered
    greedily once and ``samples`` times at ``temperature``."""

    kl_coef: float = redeclare(RunConfig, "kl_coef", 0.0)  # a card charges no KL penalty
    out: str = redeclare(RunConfig, "out", "runs/profile")
    levels: list[int] | None = option(
        None, parse=level_list, metavar="LEVELS",
        help="comma-separated levels of the task to card, e.g. 0,1,2 (default: %(default)s, "
        "the env as --env-arg makes it)",
    )  # fmt: skip
    episodes: int = option(32, low=1, help="questions a level (default: %(default)s)")
    samples: int = option(
        8, low=1, metavar="K",
        help="samples a question at --temperature, for pass@1 and pass@K (default: "
        "%(default)s)",
    )  # fmt: skip
    num_envs: int = option(
        8, low=1,
        help="sub-envs stepped together: the samples of max(1, NUM_ENVS // K) questions a "
        "batch (default: %(default)s)",
    )  # fmt: skip
    compare: str | None = option(
        None, metavar="RUN_DIR",
        help="play nothing: hold the training run in RUN_DIR against the learning card of its "
        "task (its sampled success per iteration against the card's seeds' band; "
        "llm_gym.run.learning), print the table and write comparison.md and comparison.png "
        "to --out (default: %(default)s)",
    )  # fmt: skip

    def __post_init__(self) -> None:
        super().__post_init__()
        check_count("num_envs", "--num-envs", self.num_envs, MAX_ENVS, _AT_ONCE)
        if self.asynchronous or self.curriculum or self.kl_coef or self.report_to:
            raise ValueError(
                "profile plays each level's questions in the vector env at a fixed level, "
                "charges no KL penalty and writes its card to --out: drop --async, --ray, "
                "--curriculum, --kl-coef and --report-to"
            )
        if self.levels is not None and "level" in self.env_args:
            raise ValueError(
                f"levels (--levels) and env_args' level={self.env_args['level']!r} (--env-arg) "
                "both set the level: pass one"
            )
