"""llm_gym: Gymnasium environments for reinforcement learning on language models.

Importing the package registers every environment id with Gymnasium, and loads nothing
heavy: torch, transformers and datasets load when an env, policy or wrapper that needs them
is made. The names below are imported on first use::

    import gymnasium as gym, llm_gym
    env = gym.make("LLMChat-v0", query="hi")
"""

import importlib
from collections.abc import Callable
from typing import Any

from gymnasium.envs.registration import register, registry

__version__ = "0.1.0"

# Public name -> the module that defines it (None: the name is a subpackage or module).
_EXPORTS = {
    "ChatEnv": "llm_gym.envs",
    "DatasetChatEnv": "llm_gym.envs",
    "DatasetChatVectorEnv": "llm_gym.envs",
    "TokenEnv": "llm_gym.envs",
    "TextArenaEnv": "llm_gym.envs",
    "ForkError": "llm_gym.envs",
    "fork": "llm_gym.envs",
    "fork_sub_env": "llm_gym.envs",
    "ChatHistory": "llm_gym.chat",
    "History": "llm_gym.chat",
    "LogProbs": "llm_gym.chat",
    "Masks": "llm_gym.chat",
    "Response": "llm_gym.chat",
    "Text": "llm_gym.chat",
    "Tokens": "llm_gym.chat",
    "TransformersPolicy": "llm_gym.policies",
    "Policy": "llm_gym.policies",
    "RolloutFromModel": "llm_gym.torchrl",
    "AsyncEpisodes": "llm_gym.episodes",
    "Task": "llm_gym.tasks",
    "chat": None,
    "envs": None,
    "episodes": None,
    "games": None,
    "lm": None,
    "policies": None,
    "rewards": None,
    "sources": None,
    "tasks": None,
    "torchrl": None,
    "wrappers": None,
}

__all__ = sorted([*_EXPORTS, "register_task"])


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'llm_gym' has no attribute {name!r}")
    module = _EXPORTS[name]
    value = importlib.import_module(f"llm_gym.{name}" if module is None else module)
    if module is not None:
        value = getattr(value, name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


def _register(env_id: str, **kwargs: Any) -> None:
    # Re-importing (e.g. under importlib.reload) must not warn about overriding an id.
    if env_id not in registry:
        # Gymnasium 1.4's PassiveEnvChecker breaks for good when a first reset raises (docs:
        # envs/index.md, "Bad input and hostile output"); the tests run the stricter check_env
        # on every id.
        register(id=env_id, disable_env_checker=True, **kwargs)


def register_task(env_id: str, task_factory: str | Callable[..., Any]) -> None:
    """Register ``env_id`` as the env of a task: ``gym.make(env_id, **kwargs)`` calls
    ``task_factory`` (a function returning an ``llm_gym.tasks.Task``, or its
    ``"module:function"`` path, imported only when an env is made) with the arguments it
    declares and gives the rest to ``DatasetChatEnv``; ``gym.make_vec`` gives the native
    vector env. See ``llm_gym.envs.make_task_env``."""
    _register(
        env_id,
        entry_point="llm_gym.envs.dataset:make_task_env",
        vector_entry_point="llm_gym.envs.vector:make_task_vector_env",
        kwargs={"task_factory": task_factory},
    )


# String entry points: nothing is imported until an env is made. No max_episode_steps:
# TimeLimit would turn the end of a single-turn task into a truncation.
_register("LLMChat-v0", entry_point="llm_gym.envs.chat:ChatEnv")
register_task("LLMChat-GSM8K-v0", "llm_gym.tasks.gsm8k:gsm8k_task")
register_task("LLMChat-Countdown-v0", "llm_gym.tasks.countdown:countdown_task")
register_task("LLMChat-ReasoningGym-v0", "llm_gym.tasks.reasoning_gym:reasoning_gym_task")
register_task("LLMChat-MATH-v0", "llm_gym.tasks.math:math_task")
register_task("LLMChat-Products-v0", "llm_gym.tasks.products:products_task")
register_task("LLMChat-HumanEval-v0", "llm_gym.tasks.humaneval:humaneval_task")
register_task("LLMChat-IFEval-v0", "llm_gym.tasks.ifeval:ifeval_task")
_register(
    "LLMChat-TextArena-v0",
    entry_point="llm_gym.envs.textarena:TextArenaEnv",
    vector_entry_point="llm_gym.envs.textarena:make_textarena_vector_env",
)
_register(
    "LLMChat-Terminal-v0",
    entry_point="llm_gym.envs.terminal:TerminalEnv",
    vector_entry_point="llm_gym.envs.terminal:make_terminal_vector_env",
)
_register(
    "LLMChat-OpenEnv-v0",
    entry_point="llm_gym.envs.openenv_client:OpenEnvChatEnv",
    vector_entry_point="llm_gym.envs.openenv_client:make_openenv_vector_env",
)
_register(
    "LLMChat-Verifiers-v0",
    entry_point="llm_gym.envs.verifiers:VerifiersChatEnv",
    vector_entry_point="llm_gym.envs.verifiers:make_verifiers_vector_env",
)
_register(
    "LLMToken-GSM8K-v0",
    entry_point="llm_gym.envs.tokens:make_token_env",
    kwargs={"task": "LLMChat-GSM8K-v0", "max_new_tokens": 256, "max_prompt_length": 512},
)
