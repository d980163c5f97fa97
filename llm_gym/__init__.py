"""llm_gym: Gymnasium environments for reinforcement learning on language models.

Importing the package registers every environment id with Gymnasium::

    import gymnasium as gym, llm_gym
    env = gym.make("LLMChat-v0", query="hi")
"""

from gymnasium.envs.registration import register, registry

from llm_gym import envs, policies
from llm_gym.chat import ChatHistory, History, LogProbs, Masks, Response, Text, Tokens
from llm_gym.envs import ChatEnv, DatasetChatEnv, DatasetChatVectorEnv, GSM8KEnv, TokenEnv
from llm_gym.policies import TransformersPolicy
from llm_gym.rollout import RolloutFromModel

__version__ = "0.1.0"

__all__ = [
    "ChatEnv",
    "ChatHistory",
    "DatasetChatEnv",
    "DatasetChatVectorEnv",
    "GSM8KEnv",
    "History",
    "LogProbs",
    "Masks",
    "Response",
    "RolloutFromModel",
    "Text",
    "TokenEnv",
    "Tokens",
    "TransformersPolicy",
    "envs",
    "policies",
]


def _register(env_id: str, **kwargs) -> None:
    # Re-importing (e.g. under importlib.reload) must not warn about overriding an id.
    if env_id not in registry:
        register(id=env_id, **kwargs)


_register("LLMChat-v0", entry_point="llm_gym.envs.chat:ChatEnv")
# No max_episode_steps: TimeLimit would turn the end of a single-turn task into a truncation.
_register(
    "LLMChat-GSM8K-v0",
    entry_point="llm_gym.envs.gsm8k:GSM8KEnv",
    vector_entry_point="llm_gym.envs.gsm8k:make_gsm8k_vector_env",
)
_register("LLMToken-GSM8K-v0", entry_point="llm_gym.envs.tokens:make_gsm8k_token_env")
