"""The environments; each is registered with Gymnasium on ``import llm_gym``."""

from llm_gym.envs.chat import ChatEnv
from llm_gym.envs.dataset import DatasetChatEnv
from llm_gym.envs.gsm8k import GSM8KEnv, load_gsm8k
from llm_gym.envs.tokens import TokenEnv
from llm_gym.envs.vector import DatasetChatVectorEnv

__all__ = [
    "ChatEnv",
    "DatasetChatEnv",
    "DatasetChatVectorEnv",
    "GSM8KEnv",
    "TokenEnv",
    "load_gsm8k",
]
