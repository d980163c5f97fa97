"""Tasks: data, a system prompt and a reward, served by ``DatasetChatEnv``. One file a task."""

from llm_gym.tasks.gsm8k import (
    GSM8K_SYSTEM_PROMPT,
    gsm8k_task,
    load_gsm8k,
    make_gsm8k_env,
    make_gsm8k_vector_env,
)

__all__ = [
    "GSM8K_SYSTEM_PROMPT",
    "gsm8k_task",
    "load_gsm8k",
    "make_gsm8k_env",
    "make_gsm8k_vector_env",
]
