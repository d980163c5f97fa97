"""Where ``AsyncEpisodes``' sub-envs live: ``EnvWorker`` holds a group of them (its slots),
in the driver's process (stepped from threads) or in a Ray actor on any node of a cluster.
The driver hands each slot an item to start from, so a worker holds no part of the stream:
a lost worker's episodes start again elsewhere from their items."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import gymnasium as gym

if TYPE_CHECKING:
    from llm_gym.policies.base import Action

__all__ = ["EnvWorker", "forwarded_env_vars"]

# Settings a worker on another node needs to find data and models as the driver does.
_FORWARDED_PREFIXES = ("LLM_GYM_", "HF_")


class EnvWorker:
    """Sub-envs ``slots`` made by ``env_fn``, each started from an item and stepped on its
    own; every method touches one slot, so slots may be stepped from threads at once.

    >>> from llm_gym.envs import DatasetChatEnv
    >>> worker = EnvWorker(lambda: DatasetChatEnv([{"query": "2+2?"}]), slots=[3])
    >>> obs, info = worker.start(3, {"query": "1+1?"})
    >>> obs["history"][-1]["content"], worker.step(3, "2")[2]
    ('1+1?', True)
    """

    def __init__(self, env_fn: Callable[[], gym.Env], slots: Iterable[int]) -> None:
        self.envs: dict[int, gym.Env] = {}
        for slot in slots:
            env = env_fn()
            if not hasattr(env.unwrapped, "source"):
                raise TypeError(
                    "env_fn must make a DatasetChatEnv (or a wrapped one), whose reset takes "
                    f"options={{'item': ...}}; it made {type(env.unwrapped).__name__}"
                )
            self.envs[slot] = env

    def start(self, slot: int, item: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
        """Start slot ``slot``'s next episode from ``item`` (a record of the env's data)."""
        return self.envs[slot].reset(options={"item": dict(item)})

    def step(self, slot: int, action: Action) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        """Step slot ``slot`` with ``action``: Gymnasium's five-tuple."""
        return self.envs[slot].step(action)

    def node(self) -> str:
        """The Ray node this worker runs on ("local" outside Ray)."""
        try:
            import ray
        except ImportError:
            return "local"
        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else "local"

    def close(self) -> None:
        """Close every slot's env (their tools' servers with them)."""
        for env in self.envs.values():
            env.close()


def forwarded_env_vars(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The driver's environment variables a worker on another node needs (``LLM_GYM_*``, for
    data such as ``LLM_GYM_GSM8K_PATH``, and ``HF_*``, for offline models), passed in the
    actors' ``runtime_env``."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items() if k.startswith(_FORWARDED_PREFIXES)}
