"""Running a model on a task: ``RunConfig`` (``config``), shared by ``llm-gym rollout``
(``RolloutConfig``) and ``llm-gym train`` (``llm_gym.train.GRPOConfig``); what every run sets
up (``setup``); and the rollout driver (``rollout``)."""

from llm_gym.run.config import RunConfig
from llm_gym.run.rollout import Rollout, RolloutConfig, Summary

__all__ = ["Rollout", "RolloutConfig", "RunConfig", "Summary"]
