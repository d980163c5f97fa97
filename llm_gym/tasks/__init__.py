"""Tasks: one module a task, each a function returning a ``Task`` whose env id
(``LLMChat-<task>-v0``) is registered on ``import llm_gym`` (``llm_gym.register_task``).

In the tasks' Rewards sections, "TorchRL's parts" are the ``info`` keys ``reward_answer``,
``reward_think``, ``reward_right``, ``reward`` and ``success`` of TorchRL's reward parsers.
"""

from llm_gym.rewards.answers import ANSWER_FORMATS, system_prompt
from llm_gym.rubrics import TaskReward, TaskScore
from llm_gym.tasks.countdown import COUNTDOWN_LEVELS, countdown_task
from llm_gym.tasks.gsm8k import GSM8K_SYSTEM_PROMPT, gsm8k_task, load_gsm8k
from llm_gym.tasks.harbor import HarborTaskError, TerminalTask, load_harbor_tasks
from llm_gym.tasks.ifeval import IFEVAL_LEVELS, ifeval_prompt, ifeval_task
from llm_gym.tasks.math import load_math, math_task
from llm_gym.tasks.products import PRODUCTS_CODE_REQUEST, products_task
from llm_gym.tasks.reasoning_gym import reasoning_gym_task
from llm_gym.tasks.task import Task, reward_version
from llm_gym.tasks.terminal import TERMINAL_LEVELS, terminal_task

__all__ = [
    "ANSWER_FORMATS",
    "COUNTDOWN_LEVELS",
    "GSM8K_SYSTEM_PROMPT",
    "HarborTaskError",
    "IFEVAL_LEVELS",
    "PRODUCTS_CODE_REQUEST",
    "TERMINAL_LEVELS",
    "Task",
    "TaskReward",
    "TaskScore",
    "TerminalTask",
    "countdown_task",
    "gsm8k_task",
    "ifeval_prompt",
    "ifeval_task",
    "load_gsm8k",
    "load_harbor_tasks",
    "load_math",
    "math_task",
    "products_task",
    "reasoning_gym_task",
    "reward_version",
    "system_prompt",
    "terminal_task",
]
