"""Alias of ``llm_gym.torchrl`` for ``RolloutFromModel`` (TorchRL's recipe, under a
TorchRL-named home since the layout of issue 38: "rollout" means ``llm-gym rollout``). New code
imports from ``llm_gym.torchrl``."""

from llm_gym.torchrl import RolloutFromModel

__all__ = ["RolloutFromModel"]
