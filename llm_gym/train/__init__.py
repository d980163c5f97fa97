"""Training through llm_gym: ``llm-gym train``'s GRPO trainer and what it writes.

- ``grpo``: ``GRPOConfig``, ``GRPOTrainer`` (one file, top to bottom: sample a batch of
  groups from the native vector env, score, group-relative advantages, clipped surrogate),
  ``group_advantages`` and ``grpo_loss``.
- ``evaluation``: greedy success on held-out questions, before and after training.
- ``records``: ``metrics.jsonl``, the curves' plot and the checkpoints ``--resume`` reads.
- ``setup``: device and dtype by name, and the task's vector env in tokens mode.
"""

from llm_gym.train.evaluation import evaluate
from llm_gym.train.grpo import GRPOConfig, GRPOTrainer, group_advantages, grpo_loss
from llm_gym.train.setup import DTYPES, make_task_envs, resolve_device, resolve_dtype

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
