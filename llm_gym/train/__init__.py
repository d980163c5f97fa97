"""``llm-gym train``: GRPO through llm_gym (``grpo``), whole episodes across a vector env and
the greedy evaluation (``episodes``). ``DTYPES``, ``make_task_envs``, ``resolve_device`` and
``resolve_dtype`` live in ``llm_gym.run.setup``."""

from llm_gym.run.setup import DTYPES, make_task_envs, resolve_device, resolve_dtype
from llm_gym.train.episodes import evaluate
from llm_gym.train.grpo import GRPOConfig, GRPOTrainer, group_advantages, grpo_loss

__all__ = [
    "DTYPES",
    "GRPOConfig",
    "GRPOTrainer",
    "evaluate",
    "group_advantages",
    "grpo_loss",
    "make_task_envs",
    "resolve_device",
    "resolve_dtype",
]
