"""Running a model on a task: the shared ``config``, every run's ``setup``, the ``rollout``.

The names below are imported on first use, so ``llm_gym.run.config`` loads without torch."""

import importlib
from typing import Any

# Public name -> the module that defines it.
_EXPORTS = {
    "Rollout": "llm_gym.run.rollout",
    "RolloutConfig": "llm_gym.run.config",
    "RunConfig": "llm_gym.run.config",
    "Summary": "llm_gym.run.rollout",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'llm_gym.run' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value
