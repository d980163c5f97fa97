"""Running a model on a task: the shared ``config``, every run's ``setup``, the ``rollout``."""

from llm_gym.run.config import RunConfig
from llm_gym.run.rollout import Rollout, RolloutConfig, Summary

__all__ = ["Rollout", "RolloutConfig", "RunConfig", "Summary"]
