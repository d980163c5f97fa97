"""Running a model on a task: the run configuration that ``llm-gym rollout`` and
``llm-gym train`` share (``config``: ``RunConfig``, which ``RolloutConfig`` and
``llm_gym.train.GRPOConfig`` extend), what every run sets up (``setup``: device, dtype, the
task's vector env, the sampler, the KL penalty) and the rollout driver (``rollout``)."""

from llm_gym.run.config import RunConfig
from llm_gym.run.rollout import Rollout, RolloutConfig, Summary, run_rollout

__all__ = ["Rollout", "RolloutConfig", "RunConfig", "Summary", "run_rollout"]
