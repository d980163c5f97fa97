"""TorchRL's recipes, re-created in torch with no TensorDict: ``RolloutFromModel``, the
token-level RLHF rollout of a causal LM (TorchRL's ``torchrl.data.rlhf.RolloutFromModel``).
Nothing here imports TorchRL."""

from llm_gym.torchrl.rollout_from_model import RolloutFromModel

__all__ = ["RolloutFromModel"]
