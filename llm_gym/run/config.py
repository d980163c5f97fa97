"""The run configuration ``RolloutConfig`` (here) and ``GRPOConfig`` extend (so every function
of a run takes either). This module imports nothing heavy.

>>> RunConfig(max_new_tokens=0)
Traceback (most recent call last):
...
ValueError: max_new_tokens must be an int >= 1, got 0
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from llm_gym.checks import check_choice, check_int, check_number
from llm_gym.run.budget import MAX_ENVS, check_count
from llm_gym.run.trackers import check_report_to, report_to

__all__ = [
    "BACKENDS", "DTYPE_CHOICES", "DTYPE_NAMES", "RUBRIC_PARTS", "RolloutConfig", "RunConfig",
    "is_url", "rubric_weights",
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

    env: str = "LLMChat-ReasoningGym-v0"  # procedural and offline: runs anywhere
    env_args: dict[str, Any] = field(default_factory=dict)
    answer_format: str | None = None  # None: the env's
    curriculum: int = 0  # the difficulty curriculum's window; 0: off
    tools: list[str] | None = None  # e.g. ["python"]: multi-turn episodes with tool calls
    max_tool_calls: int = 4
    tool_format: str = "hermes"
    model: str = "default"
    max_new_tokens: int = 256
    temperature: float = 0.7  # 0: greedy
    kl_coef: float = 0.05  # the KL penalty's coefficient, where there is a reference
    estimator: str = "k1"
    device: str = "auto"
    dtype: str = "auto"  # sampling's, the reference's, a judge's, a vLLM server's
    seed: int = 0
    backend: str = "transformers"
    base_url: str | None = None  # backend "openai": the server
    served_model: str | None = None  # backend "openai": the model's name there (None: its only)
    backend_args: dict[str, Any] = field(default_factory=dict)  # backend "vllm": engine options
    vllm_python: str | None = None  # backend "vllm": its interpreter (None: found)
    # The asynchronous driver (llm_gym.episodes.AsyncEpisodes); with ray_address its env
    # workers are Ray actors ("local": the cluster running here, else a new one).
    asynchronous: bool = False
    ray_address: str | None = None
    workers: int = 1
    # The reward's parts (rubric_weights) and the LLM judge its judge parts ask: 'default',
    # a model folder, or an OpenAI-compatible server's URL (its prompts built with
    # judge_tokenizer's chat template; None: the model's).
    rubric: str = "task"
    judge: str | None = None
    judge_tokenizer: str | None = None
    out: str = "runs/rollout"
    overwrite: bool = False
    progress: bool = True
    # Experiment trackers the run reports to as it runs (llm_gym.run.trackers): "none",
    # "all" or comma-separated names, as TRL's report_to; a list of names once checked.
    report_to: str | list[str] = "none"

    def __post_init__(self) -> None:
        if isinstance(self.report_to, str):
            self.report_to = report_to(self.report_to)
        check_report_to(self.report_to)
        check_int("curriculum", self.curriculum, 0)
        check_int("max_tool_calls", self.max_tool_calls, 1)
        check_int("max_new_tokens", self.max_new_tokens, 1)
        check_number("temperature", self.temperature, 0)
        check_number("kl_coef", self.kl_coef, 0)
        check_choice("dtype", self.dtype, DTYPE_CHOICES)
        check_int("seed", self.seed, 0)
        check_choice("backend", self.backend, BACKENDS)
        if (self.backend == "openai") != (self.base_url is not None):
            raise ValueError(
                "base_url (--base-url) names the server of backend 'openai' and only that: got "
                f"backend={self.backend!r} with base_url={self.base_url!r}"
            )
        check_int("workers", self.workers, 1)
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

    split: str | None = None
    data_dir: str | None = None
    num_envs: int = 8
    episodes: int | None = None  # None: one epoch of a dataset split, else 64
    ref_model: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("num_envs", self.num_envs, 1)
        check_count("num_envs", "--num-envs", self.num_envs, MAX_ENVS, _AT_ONCE)
        check_int("episodes", self.episodes, 1, optional=True)
        if "group-judge" in rubric_weights(self.rubric):
            raise ValueError(
                "rubric part 'group-judge' ranks a GRPO group's responses: train has groups "
                "(llm-gym train --rubric ...), rollout does not; use 'judge' here"
            )
