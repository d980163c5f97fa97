"""Tasks: a ``Task`` is a source of items, a system prompt, an answer format and a reward.

One file a task, each a function returning a ``Task`` whose env id is registered on
``import llm_gym`` (``llm_gym.register_task``):

- ``gsm8k``: GSM8K (``LLMChat-GSM8K-v0``), TorchRL's prompt and reward.
- ``countdown``: Countdown (``LLMChat-Countdown-v0``), generated, with levels.
- ``math``: MATH (``LLMChat-MATH-v0``), answers checked by ``math-verify``.
- ``reasoning_gym``: any reasoning-gym task (``LLMChat-ReasoningGym-v0``), with its levels.
"""

from llm_gym.rewards.answers import ANSWER_FORMATS, system_prompt
from llm_gym.tasks.countdown import COUNTDOWN_LEVELS, countdown_task
from llm_gym.tasks.gsm8k import GSM8K_SYSTEM_PROMPT, gsm8k_task, load_gsm8k
from llm_gym.tasks.math import load_math, math_task
from llm_gym.tasks.reasoning_gym import reasoning_gym_task
from llm_gym.tasks.task import Task, TaskReward, TaskScore

__all__ = [
    "ANSWER_FORMATS",
    "COUNTDOWN_LEVELS",
    "GSM8K_SYSTEM_PROMPT",
    "Task",
    "TaskReward",
    "TaskScore",
    "countdown_task",
    "gsm8k_task",
    "load_gsm8k",
    "load_math",
    "math_task",
    "reasoning_gym_task",
    "system_prompt",
]
