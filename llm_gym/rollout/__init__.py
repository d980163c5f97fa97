"""``RolloutFromModel``: token-level RLHF rollouts of a causal LM, TorchRL's recipe in torch."""

from llm_gym.rollout.model import RolloutFromModel

__all__ = ["RolloutFromModel"]
