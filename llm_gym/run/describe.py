"""What a run names in its ``summary.json`` and report: env id, task, levels played, answer
format, model, backend, seed (one record for ``llm-gym rollout`` and ``llm-gym train``)."""

from __future__ import annotations

import inspect
from typing import Any

import gymnasium as gym

from llm_gym.envs.dataset import task_function
from llm_gym.lm.loading import DEFAULT_MODEL_NAME
from llm_gym.run.config import RunConfig

__all__ = ["answer_format_of", "describe_run", "run_rows", "run_title"]


def describe_run(
    config: RunConfig,
    answer_format: str | None,
    task_names: set[str],
    levels: set[int],
    backend: str,
) -> dict[str, Any]:
    """What a run's ``summary.json`` names: the env id, the task (its function and the names
    the env reported), the ``levels`` played, the answer format, model, backend and seed."""
    function = _task_function(config.env)
    return {
        "env": config.env,
        "task": {"function": function, "name": ", ".join(sorted(task_names)) or None},
        "levels": sorted(levels),
        "answer_format": answer_format,
        "model": DEFAULT_MODEL_NAME if config.model == "default" else config.model,
        "backend": backend,
        "seed": config.seed,
    }


def answer_format_of(config: RunConfig) -> str | None:
    """``config.answer_format`` where its env's task asks for an answer format (its task
    function takes ``answer_format``); None for an env with a format of its own (code, games),
    which is not given one."""
    function = task_function(config.env)
    if config.answer_format is None or function is None:
        return None
    takes = callable(function) and "answer_format" in inspect.signature(function).parameters
    return config.answer_format if takes else None


def run_title(run: dict[str, Any]) -> str:
    """A plot's and report's title for a ``describe_run`` record: task, model, answer format."""
    task = run["task"]["name"] or run["env"]
    return f"{task} · {run['model']} · answer format {run['answer_format']}"


def run_rows(run: dict[str, Any]) -> list[tuple[str, Any]]:
    """A ``describe_run`` record as a report's ``(name, value)`` rows."""
    task = run["task"]
    levels = ", ".join(map(str, run["levels"])) or "n/a"
    return [
        ("env", run["env"]), ("task", task["name"] or task["function"]), ("levels", levels),
        ("answer format", run["answer_format"]), ("model", run["model"]),
        ("backend", run["backend"]), ("seed", run["seed"]),
    ]  # fmt: skip


def _task_function(env_id: str) -> str | None:
    """The task function ``env_id`` is registered with, as ``module:function``."""
    factory = gym.spec(env_id).kwargs.get("task_factory")
    if factory is None or isinstance(factory, str):
        return factory
    return f"{factory.__module__}:{factory.__qualname__}"
