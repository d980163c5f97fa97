"""Building a task's ``DatasetChatEnv`` from its data, prompt and reward and the user's args."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llm_gym.envs.dataset import DatasetChatEnv

__all__ = ["task_env"]


def task_env(
    dataset: Any, task: Mapping[str, Any], env_kwargs: Mapping[str, Any], **fixed: Any
) -> DatasetChatEnv:
    """``DatasetChatEnv(dataset, **fixed, **task, **env_kwargs)``: the user's arguments win
    over the task's, except ``system_prompt=None``, which keeps the task's prompt."""
    given = {k: v for k, v in env_kwargs.items() if not (k == "system_prompt" and v is None)}
    return DatasetChatEnv(dataset, **fixed, **(dict(task) | given))
