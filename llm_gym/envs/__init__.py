"""llm_gym.envs."""
