"""The vector ``DifficultyCurriculum``: one level for all sub-envs, moved by the success rate
of the episodes they finish."""

from __future__ import annotations

import inspect
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import VectorEnv, VectorWrapper

from llm_gym.wrappers import curriculum as single
from llm_gym.wrappers.curriculum import LevelSchedule, levels_of
from llm_gym.wrappers.vector._signature import single_env_arguments

__all__ = ["DifficultyCurriculum"]


def _finished_successes(info: dict[str, Any], done: np.ndarray, key: str) -> list[bool]:
    # SAME_STEP autoreset (the native vector env) keeps a finished episode's step info in
    # info["final_info"]; NEXT_STEP (Gymnasium's default) in info itself.
    source = info.get("final_info", info)
    values, mask = source.get(key), source.get(f"_{key}")
    successes = []
    for i in np.flatnonzero(done):
        present = values is not None and (mask is None or bool(mask[i]))
        successes.append(bool(values[i]) if present else False)
    return successes


def _levels(env: VectorEnv) -> tuple[int, int]:
    base = env.unwrapped
    if hasattr(base, "set_level"):  # the native vector env: one shared level
        return levels_of(base)
    if hasattr(base, "envs"):  # SyncVectorEnv holds its sub-envs
        return levels_of(base.envs[0].unwrapped)
    try:  # AsyncVectorEnv: ask the workers
        num_levels, level = env.get_attr("num_levels")[0], env.get_attr("level")[0]
    except AttributeError:
        num_levels = level = None
    if num_levels is None:
        return levels_of(base)  # raises, saying what is missing
    return int(num_levels), int(level)


class DifficultyCurriculum(VectorWrapper, gym.utils.RecordConstructorArgs):
    """``llm_gym.wrappers.DifficultyCurriculum`` for a vector env: every finished episode
    counts; the level is set on all sub-envs (``set_level`` of the native vector env, else
    ``call("set_level", ...)``); ``info["level"]`` is an array over sub-envs."""

    __signature__ = inspect.signature(single.DifficultyCurriculum)

    def __init__(self, env: VectorEnv, *args: Any, **kwargs: Any) -> None:
        named = single_env_arguments(single.DifficultyCurriculum, env, args, kwargs)
        gym.utils.RecordConstructorArgs.__init__(self, **named)
        num_levels, level = _levels(env)
        self.schedule = LevelSchedule(
            num_levels, level, named["window"], named["raise_at"], named["lower_below"]
        )
        self.success_key = named["success_key"]
        VectorWrapper.__init__(self, env)

    @property
    def level(self) -> int:
        return self.schedule.level

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        return obs, self._with_level(info)

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict]:
        obs, rewards, terminated, truncated, info = self.env.step(actions)
        info = self._with_level(info)
        before = self.level
        for success in _finished_successes(info, terminated | truncated, self.success_key):
            self.schedule.record(success)
        if self.level != before:
            base = self.env.unwrapped
            if hasattr(base, "set_level"):  # the native vector env: one shared level
                base.set_level(self.level)
            else:
                self.env.call("set_level", self.level)
        return obs, rewards, terminated, truncated, info

    def _with_level(self, info: dict[str, Any]) -> dict[str, Any]:
        info = dict(info)
        info["level"] = np.full(self.num_envs, self.level, dtype=np.int64)
        info["_level"] = np.ones(self.num_envs, dtype=bool)
        return info
