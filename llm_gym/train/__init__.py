"""Training through llm_gym: ``llm-gym train``'s GRPO trainer and what it writes.

- ``grpo``: ``GRPOConfig`` (a ``llm_gym.run.RunConfig`` plus GRPO's settings),
  ``GRPOTrainer`` (one file, top to bottom: play a batch of groups in the native vector env,
  score, group-relative advantages, clipped surrogate), ``group_advantages``, ``grpo_loss``.
- ``episodes``: one whole episode per sub-env (one turn, or several with tools), and
  ``evaluate``: greedy success on held-out questions, before and after training.
- ``records``: ``metrics.jsonl``, the curves' plot and the checkpoints ``--resume`` reads.

``DTYPES``, ``make_task_envs``, ``resolve_device`` and ``resolve_dtype`` live in
``llm_gym.run`` and are importable from here as before.
"""

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
