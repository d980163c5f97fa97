"""``Task``: where a task's items come from, how they are asked and how answers are scored.

A task is data, not an env: ``DatasetChatEnv.from_task(task, ...)`` (or the task's registered
env id) serves it, and the env owns how items are served (seed, shuffle, ``repeats``, shards).

>>> task = Task(source=[{"query": "2+2?", "answer": "4"}], prompt="Answer with a number.",
...             reward=lambda response, item: (float(response == item["answer"]), {}))
>>> task.reward("4", task.source[0])
(1.0, {})
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from llm_gym.rubrics.score import TaskReward

__all__ = ["FieldMap", "Task", "reward_version"]


# Renames from a record's columns to the env's fields, or a function of the record.
FieldMap = Mapping[str, str] | Callable[[Mapping[str, Any]], Mapping[str, Any]]


@dataclass(frozen=True)
class Task:
    """One task, as ``DatasetChatEnv`` serves it.

    - ``source``: where the items come from: a ``llm_gym.sources.Source`` (a generator at a
      level, an iterable) or indexable rows (a ``datasets.Dataset``, a list of dicts, any
      ``dataset=`` value ``DatasetChatEnv`` takes), which the env serves in seeded epochs.
    - ``prompt``: the system prompt (None: none); it asks for ``answer_format``.
    - ``reward``: ``reward(response_text, item) -> TaskScore | (reward, info)``; None: 0.0.
    - ``answer_format``: the name in ``llm_gym.rewards.ANSWER_FORMATS`` that the prompt asks
      for and the reward reads (None for a task with a format of its own).
    - ``field_map``: renames of the items' columns to the env's fields; each item must end
      up with a str ``"query"``, the user's message.
    - ``required_fields``: the fields ``reward`` reads, checked on the first item when the
      env is made.
    - ``concurrent_reward``: the reward is thread-safe and slow enough (code run in a
      sandbox) that a vector env scores its sub-envs at once, on threads.
    - ``reward_version``: the version of ``reward``'s scoring, changed whenever a response
      would score differently; each ended episode's info carries it (``llm-gym rescore``
      tells stored episodes scored by another version). None: unversioned.
    """

    source: Any
    prompt: str | None = None
    reward: TaskReward | None = None
    answer_format: str | None = "tags"
    field_map: FieldMap | None = None
    required_fields: tuple[str, ...] = ()
    concurrent_reward: bool = False
    reward_version: str | None = None

    def keys(self) -> tuple[str, ...]:
        """The ``DatasetChatEnv`` arguments a task unpacks into: ``DatasetChatEnv.from_dataloader(
        loader, **task)`` serves the task's prompt, fields and reward over other data."""
        return (
            "system_prompt", "reward", "answer_format", "field_map", "required_fields",
            "concurrent_reward", "reward_version",
        )  # fmt: skip

    def __getitem__(self, key: str) -> Any:
        return self.prompt if key == "system_prompt" else getattr(self, key)


def reward_version(own: str, *libraries: str) -> str:
    """A task's ``reward_version``: its ``own`` version, and the installed version of each
    library that scores for it (a library's update may change a score without a line of
    ours changing).

    >>> reward_version("1")
    '1'
    >>> reward_version("2", "numpy").startswith("2+numpy ")
    True
    """
    return "+".join([own, *(f"{name} {_installed(name)}" for name in libraries)])


def _installed(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:  # an optional extra: the task says so when it scores
        return "not installed"
