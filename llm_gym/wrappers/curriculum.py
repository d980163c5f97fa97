"""``DifficultyCurriculum``: move a task's level with the policy's success, so that the reward
stays informative as the policy learns. Tasks with levels: ``LLMChat-Countdown-v0`` (count and
size of the numbers) and ``LLMChat-ReasoningGym-v0`` (the task's curriculum)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import gymnasium as gym

from llm_gym.checks import check_number

if TYPE_CHECKING:
    from gymnasium.vector import VectorEnv

    from llm_gym.policies.base import Action
    from llm_gym.wrappers.kl import ResetArgument

__all__ = ["DifficultyCurriculum", "LevelSchedule"]


class LevelSchedule:
    """The level and the successes seen at it. The rule (a moving window, as reasoning-gym's):
    after every ``window`` finished episodes at a level, a success rate of at least ``raise_at``
    moves one level up, one below ``lower_below`` one level down; the window then restarts.

    >>> schedule = LevelSchedule(num_levels=3, level=0, window=2, raise_at=1.0, lower_below=0.5)
    >>> schedule.record([True, True, False]), schedule.level, schedule.record([False])
    (True, 1, True)
    """

    def __init__(
        self, num_levels: int, level: int, window: int, raise_at: float, lower_below: float
    ) -> None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be an int >= 1 (episodes), got {window!r}")
        for name, value in (("raise_at", raise_at), ("lower_below", lower_below)):
            if check_number(name, value, 0) > 1:
                raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
        if lower_below > raise_at:
            raise ValueError(
                f"lower_below ({lower_below}) must not exceed raise_at ({raise_at}): a rate "
                "could then both raise and lower the level"
            )
        self.num_levels, self.level = num_levels, level
        self.window, self.raise_at, self.lower_below = window, raise_at, lower_below
        self.successes: list[bool] = []

    def __copy__(self) -> LevelSchedule:
        # A forked env's curriculum (llm_gym.fork): its own window of successes.
        other = object.__new__(LevelSchedule)
        other.__dict__.update(self.__dict__, successes=list(self.successes))
        return other

    def record(self, successes: Iterable[bool]) -> bool:
        """Count finished episodes (whether each succeeded); whether the level changed."""
        before = self.level
        for success in successes:
            self.successes.append(bool(success))
            if len(self.successes) == self.window:
                rate = sum(self.successes) / self.window
                if rate >= self.raise_at and self.level < self.num_levels - 1:
                    self.level += 1
                elif rate < self.lower_below and self.level > 0:
                    self.level -= 1
                self.successes = []
        return self.level != before


def levels_of(env: gym.Env | VectorEnv) -> tuple[int, int]:
    """``(num_levels, level)`` of a task env with levels, or a clear error."""
    num_levels = getattr(env, "num_levels", None)
    if num_levels is None or not callable(getattr(env, "set_level", None)):
        raise ValueError(
            f"env must be a task with difficulty levels (num_levels and set_level), such as "
            f"LLMChat-Countdown-v0 or LLMChat-ReasoningGym-v0; got {type(env).__name__} "
            "without levels"
        )
    return int(num_levels), int(env.level)


class DifficultyCurriculum(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Move the task's level with the policy's success rate; ``info["level"]`` every step.

    Args:
        env: a task env with levels (possibly wrapped).
        window: finished episodes per decision.
        raise_at: success rate over the window that raises the level.
        lower_below: success rate under which the level goes down.
        success_key: the step ``info`` key that says an episode succeeded.

    >>> import gymnasium as gym, llm_gym
    >>> env = DifficultyCurriculum(gym.make("LLMChat-Countdown-v0", level=0, seed=0), window=2)
    >>> obs, info = env.reset(seed=0)
    >>> info["level"]
    0
    >>> for _ in range(2):  # two wrong answers: level 0 is already the lowest
    ...     obs, info = env.reset()
    ...     *_, info = env.step("<answer>0</answer>")
    >>> info["level"]
    0
    """

    def __init__(
        self,
        env: gym.Env,
        window: int = 32,
        raise_at: float = 0.8,
        lower_below: float = 0.2,
        success_key: str = "success",
    ) -> None:
        gym.utils.RecordConstructorArgs.__init__(
            self, window=window, raise_at=raise_at, lower_below=lower_below, success_key=success_key
        )
        num_levels, level = levels_of(env.unwrapped)
        self.schedule = LevelSchedule(num_levels, level, window, raise_at, lower_below)
        self.success_key = success_key
        gym.Wrapper.__init__(self, env)

    @property
    def level(self) -> int:
        """The level the next episodes are played at."""
        return self.schedule.level

    def reset(self, **kwargs: ResetArgument) -> tuple[Any, dict[str, Any]]:
        """Reset the env; ``info["level"]`` is the level."""
        obs, info = self.env.reset(**kwargs)
        return obs, {**info, "level": self.level}

    def step(self, action: Action) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        """Step the env; a finished episode counts towards the level's window."""
        obs, reward, terminated, truncated, info = self.env.step(action)
        info = {**info, "level": self.level}  # the level this episode was played at
        finished = [bool(info.get(self.success_key, False))] if terminated or truncated else []
        if self.schedule.record(finished):
            self.env.unwrapped.set_level(self.level)
        return obs, reward, terminated, truncated, info
