"""Running a model on a task: the run configuration that ``llm-gym rollout`` and
``llm-gym train`` share, what every run sets up, and the rollout driver.

- ``config``: ``RunConfig`` (model, task, tools, KL, device, dtype, seed, run folder), which
  ``RolloutConfig`` and ``llm_gym.train.GRPOConfig`` extend.
- ``setup``: device and dtype by name, the task's vector env, the sampler, the KL penalty.
- ``rollout``: ``Rollout`` / ``run_rollout``, what ``llm-gym rollout`` runs, and its
  ``Summary``.
"""

from llm_gym.run.config import DTYPE_NAMES, RunConfig
from llm_gym.run.rollout import (
    EPISODES_FILE,
    Rollout,
    RolloutConfig,
    Summary,
    make_envs,
    run_rollout,
)
from llm_gym.run.setup import (
    DTYPES,
    charge_kl,
    make_sampler,
    make_task_envs,
    resolve_device,
    resolve_dtype,
    task_envs,
)

__all__ = [
    "DTYPES",
    "DTYPE_NAMES",
    "EPISODES_FILE",
    "Rollout",
    "RolloutConfig",
    "RunConfig",
    "Summary",
    "charge_kl",
    "make_envs",
    "make_sampler",
    "make_task_envs",
    "resolve_device",
    "resolve_dtype",
    "run_rollout",
    "task_envs",
]
