"""llm_gym.wrappers."""
