"""Tasks: data, a system prompt and a reward, served by ``DatasetChatEnv``. One file a task.

- ``gsm8k``: GSM8K (``LLMChat-GSM8K-v0``), TorchRL's prompt and reward.
- ``countdown``: Countdown (``LLMChat-Countdown-v0``), procedural, with levels.
- ``math``: MATH (``LLMChat-MATH-v0``), answers checked by ``math-verify``.
- ``reasoning_gym``: any reasoning-gym task (``LLMChat-ReasoningGym-v0``), with its levels.
- ``formats``: the system prompt of each answer format, shared by all of them.
"""

from llm_gym.tasks.countdown import COUNTDOWN_LEVELS, make_countdown_env
from llm_gym.tasks.formats import FORMAT_INSTRUCTIONS, system_prompt
from llm_gym.tasks.gsm8k import (
    GSM8K_SYSTEM_PROMPT,
    gsm8k_task,
    load_gsm8k,
    make_gsm8k_env,
    make_gsm8k_vector_env,
)
from llm_gym.tasks.math import load_math, make_math_env
from llm_gym.tasks.reasoning_gym import make_reasoning_gym_env

__all__ = [
    "COUNTDOWN_LEVELS",
    "FORMAT_INSTRUCTIONS",
    "GSM8K_SYSTEM_PROMPT",
    "gsm8k_task",
    "load_gsm8k",
    "load_math",
    "make_countdown_env",
    "make_gsm8k_env",
    "make_gsm8k_vector_env",
    "make_math_env",
    "make_reasoning_gym_env",
    "system_prompt",
]
