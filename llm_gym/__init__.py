"""llm_gym: Gymnasium environments for reinforcement learning on language models."""

__version__ = "0.1.0"
