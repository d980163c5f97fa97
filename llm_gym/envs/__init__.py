"""The environments; each is registered with Gymnasium on ``import llm_gym``."""

from llm_gym.envs.chat import ChatEnv

__all__ = ["ChatEnv"]
