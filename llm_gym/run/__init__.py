"""Running a model on a task: the shared ``config``, the ``setup`` of every run, and the
rollout driver (``rollout``); ``llm_gym.train`` builds on them."""

from llm_gym.run.config import RunConfig
from llm_gym.run.rollout import Rollout, RolloutConfig, Summary

__all__ = ["Rollout", "RolloutConfig", "RunConfig", "Summary"]
