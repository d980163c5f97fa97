"""The environments; each is registered with Gymnasium on ``import llm_gym``.

``ChatEnv`` (a conversation), ``DatasetChatEnv`` (queries from a dataset, scored by a task's
reward), ``DatasetChatVectorEnv`` (N of those, batched) and ``TokenEnv`` (one token per step
over any chat task). The tasks themselves (GSM8K) live in ``llm_gym.tasks``.
"""

from llm_gym.envs.chat import ChatEnv
from llm_gym.envs.dataset import DatasetChatEnv, TaskReward, TaskScore
from llm_gym.envs.tokens import TokenEnv
from llm_gym.envs.vector import DatasetChatVectorEnv, batch_infos, sharded_env_fns

__all__ = [
    "ChatEnv",
    "DatasetChatEnv",
    "DatasetChatVectorEnv",
    "TaskReward",
    "TaskScore",
    "TokenEnv",
    "batch_infos",
    "sharded_env_fns",
]
