"""llm_gym.chat."""
