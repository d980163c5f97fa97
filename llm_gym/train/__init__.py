"""``llm-gym train``: the GRPO trainer (``grpo``) and its episodes (``episodes``)."""

from llm_gym.train.episodes import evaluate
from llm_gym.train.grpo import GRPOConfig, GRPOTrainer, group_advantages, grpo_loss

__all__ = ["GRPOConfig", "GRPOTrainer", "evaluate", "group_advantages", "grpo_loss"]
