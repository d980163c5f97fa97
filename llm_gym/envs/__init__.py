"""The environments; each is registered with Gymnasium on ``import llm_gym``.

``ChatEnv`` (a conversation), ``DatasetChatEnv`` (a task's queries, scored by its reward;
``make_task_env`` makes one from a task), ``DatasetChatVectorEnv`` (N of those, batched) and
``TokenEnv`` (one token per step over any chat task). The tasks live in ``llm_gym.tasks``.
"""

from llm_gym.envs.chat import ChatEnv
from llm_gym.envs.dataset import DatasetChatEnv, make_task_env
from llm_gym.envs.tokens import TokenEnv
from llm_gym.envs.vector import (
    DatasetChatVectorEnv,
    batch_infos,
    make_task_vector_env,
    sharded_env_fns,
)
from llm_gym.tasks.task import TaskReward, TaskScore

__all__ = [
    "ChatEnv",
    "DatasetChatEnv",
    "DatasetChatVectorEnv",
    "TaskReward",
    "TaskScore",
    "TokenEnv",
    "batch_infos",
    "make_task_env",
    "make_task_vector_env",
    "sharded_env_fns",
]
