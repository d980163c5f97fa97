"""``llm-gym train``: ``grpo`` and its ``episodes``; it re-exports scripts' ``run.setup`` names."""

from llm_gym.run.setup import DTYPES, resolve_device, resolve_dtype
from llm_gym.train.episodes import evaluate
from llm_gym.train.grpo import GRPOConfig, GRPOTrainer, group_advantages, grpo_loss

__all__ = [
    "DTYPES",
    "GRPOConfig",
    "GRPOTrainer",
    "evaluate",
    "group_advantages",
    "grpo_loss",
    "resolve_device",
    "resolve_dtype",
]
