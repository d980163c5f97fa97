"""The vector ``DifficultyCurriculum``: one level for all sub-envs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from gymnasium.vector import VectorEnv, VectorWrapper

from llm_gym.wrappers import curriculum as single
from llm_gym.wrappers.curriculum import LevelSchedule, levels_of

if TYPE_CHECKING:
    from llm_gym.policies.base import Action
    from llm_gym.wrappers.kl import ResetArgument

__all__ = ["DifficultyCurriculum"]


def _finished_successes(info: dict[str, Any], done: np.ndarray, key: str) -> list[bool]:
    # SAME_STEP autoreset (the native vector env) keeps a finished episode's step info in
    # info["final_info"]; NEXT_STEP (Gymnasium's default) in info itself.
    source = info.get("final_info", info)
    values, mask = source.get(key), source.get(f"_{key}")
    if values is None:
        return [False] * int(np.count_nonzero(done))
    return [bool(values[i]) and (mask is None or bool(mask[i])) for i in np.flatnonzero(done)]


def _levels(env: VectorEnv) -> tuple[int, int]:
    base = env.unwrapped
    if hasattr(base, "set_level"):  # the native vector env: one shared level
        return levels_of(base)
    if hasattr(base, "envs"):  # SyncVectorEnv holds its sub-envs
        return levels_of(base.envs[0].unwrapped)
    try:  # AsyncVectorEnv: ask the workers
        return int(env.get_attr("num_levels")[0]), int(env.get_attr("level")[0])
    except (AttributeError, TypeError):  # no such attribute, or None: a task without levels
        return levels_of(base)  # raises, saying what is missing


class DifficultyCurriculum(VectorWrapper):
    """``llm_gym.wrappers.DifficultyCurriculum`` for a vector env (same arguments): every
    finished episode counts; the level is set on all sub-envs (``set_level`` of the native
    vector env, else ``call("set_level", ...)``); ``info["level"]`` is an array over sub-envs."""

    def __init__(
        self,
        env: VectorEnv,
        window: int = 32,
        raise_at: float = 0.8,
        lower_below: float = 0.2,
        success_key: str = "success",
    ) -> None:
        self.schedule = LevelSchedule(*_levels(env), window, raise_at, lower_below)
        self.success_key = success_key
        super().__init__(env)

    level = single.DifficultyCurriculum.level

    def reset(self, **kwargs: ResetArgument) -> tuple[Any, dict[str, Any]]:
        """Reset the envs; ``info["level"]`` is the level of each."""
        obs, info = self.env.reset(**kwargs)
        return obs, self._with_level(info)

    def step(
        self, actions: Sequence[Action]
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict]:
        """Step the envs; every finished episode counts towards the level's window."""
        obs, rewards, terminated, truncated, info = self.env.step(actions)
        info = self._with_level(info)
        if self.schedule.record(
            _finished_successes(info, terminated | truncated, self.success_key)
        ):
            base = self.env.unwrapped
            if hasattr(base, "set_level"):  # the native vector env: one shared level
                base.set_level(self.level)
            else:
                self.env.call("set_level", self.level)
        return obs, rewards, terminated, truncated, info

    def state_dict(self) -> dict[str, Any]:
        """The level and the window of successes it moves by."""
        return {"level": self.schedule.level, "successes": list(self.schedule.successes)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Put the level and its window back as ``state_dict`` gave them (the sub-envs'
        own level is the vector env's to restore)."""
        self.schedule.level = state["level"]
        self.schedule.successes = list(state["successes"] or [])

    def _with_level(self, info: dict[str, Any]) -> dict[str, Any]:
        level = np.full(self.num_envs, self.level, dtype=np.int64)
        return {**info, "level": level, "_level": np.ones(self.num_envs, dtype=bool)}
