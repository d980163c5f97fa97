"""``llm-gym train``: the GRPO trainer (``grpo``), its options (``config``) and episodes
(``episodes``).

The names below are imported on first use, so ``llm_gym.train.config`` loads without torch."""

import importlib
from typing import Any

# Public name -> the module that defines it.
_EXPORTS = {
    "GRPOConfig": "llm_gym.train.config",
    "GRPOTrainer": "llm_gym.train.grpo",
    "evaluate": "llm_gym.train.episodes",
    "group_advantages": "llm_gym.train.grpo",
    "grpo_loss": "llm_gym.train.grpo",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'llm_gym.train' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value
