"""llm_gym.policies."""
