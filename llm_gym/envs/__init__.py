"""The environments, each registered with Gymnasium on ``import llm_gym``; the tasks they
serve live in ``llm_gym.tasks``."""

from llm_gym.envs.chat import ChatEnv
from llm_gym.envs.dataset import DatasetChatEnv, make_task_env
from llm_gym.envs.forking import ForkError, fork, fork_sub_env
from llm_gym.envs.openenv_client import OpenEnvChatEnv, make_openenv_vector_env
from llm_gym.envs.session import EnvResponse, SessionChatEnv, seed_stream
from llm_gym.envs.sharded import PartVectorEnv, sharded_env_fns, sharded_vector_env
from llm_gym.envs.terminal import TerminalEnv, make_terminal_vector_env
from llm_gym.envs.textarena import TextArenaEnv, make_textarena_vector_env
from llm_gym.envs.tokens import TokenEnv
from llm_gym.envs.vector import (
    DatasetChatVectorEnv,
    VectorHooks,
    batch_infos,
    make_task_vector_env,
    single_env,
)
from llm_gym.envs.verifiers import VerifiersChatEnv
from llm_gym.rubrics import TaskReward, TaskScore

__all__ = [
    "ChatEnv",
    "DatasetChatEnv",
    "DatasetChatVectorEnv",
    "EnvResponse",
    "ForkError",
    "OpenEnvChatEnv",
    "PartVectorEnv",
    "SessionChatEnv",
    "TaskReward",
    "TaskScore",
    "TerminalEnv",
    "TextArenaEnv",
    "TokenEnv",
    "VectorHooks",
    "VerifiersChatEnv",
    "batch_infos",
    "fork",
    "fork_sub_env",
    "make_openenv_vector_env",
    "make_task_env",
    "make_task_vector_env",
    "make_terminal_vector_env",
    "make_textarena_vector_env",
    "seed_stream",
    "sharded_env_fns",
    "sharded_vector_env",
    "single_env",
]
