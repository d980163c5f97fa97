"""llm_gym.rewards."""
