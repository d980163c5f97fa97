"""llm_gym: Gymnasium environments for reinforcement learning on language models.

Importing the package registers every environment id with Gymnasium::

    import gymnasium as gym, llm_gym
    env = gym.make("LLMChat-v0", query="hi")
"""

from gymnasium.envs.registration import register, registry

from llm_gym import envs
from llm_gym.chat import ChatHistory, History, LogProbs, Masks, Response, Text, Tokens
from llm_gym.envs import ChatEnv

__version__ = "0.1.0"

__all__ = [
    "ChatEnv",
    "ChatHistory",
    "History",
    "LogProbs",
    "Masks",
    "Response",
    "Text",
    "Tokens",
    "envs",
]


def _register(env_id: str, **kwargs) -> None:
    # Re-importing (e.g. under importlib.reload) must not warn about overriding an id.
    if env_id not in registry:
        register(id=env_id, **kwargs)


_register("LLMChat-v0", entry_point="llm_gym.envs.chat:ChatEnv")
