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
from typing import Any

from llm_gym.rubrics.score import TaskReward

__all__ = ["FieldMap", "Task"]


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
    """

    source: Any
    prompt: str | None = None
    reward: TaskReward | None = None
    answer_format: str | None = "tags"
    field_map: FieldMap | None = None
    required_fields: tuple[str, ...] = ()
    concurrent_reward: bool = False

    def keys(self) -> tuple[str, ...]:
        """The ``DatasetChatEnv`` arguments a task unpacks into: ``DatasetChatEnv.from_dataloader(
        loader, **task)`` serves the task's prompt, fields and reward over other data."""
        return (
            "system_prompt", "reward", "answer_format", "field_map", "required_fields",
            "concurrent_reward",
        )  # fmt: skip

    def __getitem__(self, key: str) -> Any:
        return self.prompt if key == "system_prompt" else getattr(self, key)
