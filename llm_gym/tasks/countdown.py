"""Countdown as a task: reach a target from a few numbers with + - * /, TorchRL's game.

Problems are generated on demand (no data to download) from a seed and a level; the level
sets how many numbers there are and how large (``COUNTDOWN_LEVELS``), so a curriculum can
start where a small model is. The reward is ``llm_gym.rewards.CountdownReward`` (safe
evaluation, 1.0 / 0.1 / 0.0).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np

from llm_gym.envs.dataset import DatasetChatEnv, TaskScore
from llm_gym.envs.procedural import ProceduralSource
from llm_gym.envs.vector import DatasetChatVectorEnv
from llm_gym.rewards.countdown import CountdownReward
from llm_gym.tasks._build import task_env
from llm_gym.tasks.formats import system_prompt

__all__ = [
    "COUNTDOWN_LEVELS",
    "COUNTDOWN_SYSTEM_PROMPT",
    "countdown_problem",
    "make_countdown_env",
    "make_countdown_vector_env",
]

# (how many numbers, the largest number) per level; level 4 is TorchRL's default game.
COUNTDOWN_LEVELS = ((2, 10), (3, 10), (3, 25), (4, 25), (4, 100), (5, 100), (6, 100))
DEFAULT_LEVEL = 4
_DESCRIPTION = (
    "The user gives a set of numbers and a target. The Assistant must find an arithmetic "
    "expression using each given number at most once that equals the target."
)
_HINT = "The answer should contain ONLY the arithmetic expression (e.g. (25 + 3) * 4)."
# TorchRL's CountdownEnv.SYSTEM_PROMPT, word for word.
COUNTDOWN_SYSTEM_PROMPT = (
    f"A conversation between User and Assistant. {_DESCRIPTION}\nThe reasoning process and "
    "answer are enclosed within <think></think> and <answer></answer> tags, respectively.\n"
    f"{_HINT}"
)


def countdown_problem(
    seed: int,
    index: int,
    level: int,
    *,
    num_count: int | None = None,
    max_number: int | None = None,
    max_target: int = 1000,
) -> dict[str, Any]:
    """Problem ``index`` of ``seed`` at ``level``: ``query``, ``target`` and ``numbers``.

    TorchRL's generator: draw the numbers, combine all of them in a random order with random
    ``+ - *``, take the absolute value; a result of 0 or above ``max_target`` becomes the sum.

    >>> countdown_problem(0, 0, 0)["numbers"] == countdown_problem(0, 0, 0)["numbers"]
    True
    """
    default_count, default_max = COUNTDOWN_LEVELS[level]
    count = default_count if num_count is None else num_count
    largest = default_max if max_number is None else max_number
    rng = np.random.default_rng([seed, index])
    numbers = [int(n) for n in rng.integers(1, largest + 1, size=count)]
    pool = [numbers[i] for i in rng.permutation(count)]
    result = pool[0]
    for n in pool[1:]:
        op = int(rng.integers(3))
        result = result + n if op == 0 else result - n if op == 1 else result * n
    target = abs(result)
    if target == 0 or target > max_target:
        target = sum(numbers)
    query = (
        f"Using the numbers {numbers}, create an arithmetic expression that equals {target}. "
        "You may use each number at most once. Only use +, -, *, / and parentheses."
    )
    return {"query": query, "target": target, "numbers": numbers}


def _score(reward: CountdownReward, response: str, sample: Mapping[str, Any]) -> TaskScore:
    target, numbers = sample["target"], sample["numbers"]
    score = reward(response, target, numbers)
    info = score.info() | {"target": target, "numbers": list(numbers)}
    return TaskScore(score.reward, info, answered=score.reward_answer > 0)


def make_countdown_env(
    *,
    level: int = DEFAULT_LEVEL,
    num_count: int | None = None,
    max_number: int | None = None,
    max_target: int = 1000,
    answer_format: str = "tags",
    correct_reward: float = 1.0,
    format_reward: float = 0.1,
    seed: int | None = None,
    **env_kwargs: Any,
) -> DatasetChatEnv:
    """Countdown: an expression over the given numbers that equals the target.

    ## Description

    The Gymnasium form of TorchRL's ``CountdownEnv``. Each episode gives a few numbers and a
    target reachable from them; the policy answers with an arithmetic expression that uses
    each number at most once. Problems are generated from the seed, offline.

    ## Action Space

    As ``ChatEnv``: a ``str`` (or token ids in ``"tokens"`` mode), or a ``Response``.

    ## Observation Space

    As ``ChatEnv``: a ``Dict`` with the prompt as ``history``, ``text`` and/or ``tokens``.

    ## Rewards

    TorchRL's ``CountdownRewardParser``: ``correct_reward`` (1.0) for an expression of
    ``+ - * /``, parentheses and the given numbers (each at most once) equal to the target,
    ``format_reward`` (0.1) for another answer, 0.0 for none. The expression is parsed, never
    ``eval``ed. ``info`` holds ``reward_answer``, ``reward_think``, ``reward_right``,
    ``reward``, ``success``, ``target`` (int) and ``numbers`` (list of int).

    ## Starting State

    ``[system, user problem]``; the reset ``info`` holds ``target`` and ``numbers``.

    ## Episode End

    With ``max_turns=1`` (default) the response ends the episode with ``terminated=True``;
    with more turns, the first answer does.

    ## Arguments

    - ``level``: 0 to 6, the count and size of the numbers (``COUNTDOWN_LEVELS``); 4, the
      default, is TorchRL's game (4 numbers up to 100). ``set_level`` changes it.
    - ``num_count`` / ``max_number``: fix the count or the largest number whatever the level.
    - ``max_target``: targets above it become the sum of the numbers (TorchRL's rule).
    - ``answer_format``: ``"tags"`` (TorchRL's prompt), ``"boxed"`` or ``"hash"``.
    - ``correct_reward`` / ``format_reward``: the reward values.
    - ``seed``: the problems' seed (the sub-envs of a vector env split its problems).
    - ``env_kwargs``: ``DatasetChatEnv``'s other arguments (``repeats``, ``group_repeats``,
      ``input_mode``, ``tokenizer``, ``assistant_prefix``, ``max_turns``, ...).

    ## Version History

    - v0: Initial version.

    ## Example

    >>> import gymnasium as gym, llm_gym
    >>> env = gym.make("LLMChat-Countdown-v0", level=0, seed=0)
    >>> obs, info = env.reset(seed=0)
    >>> a, b = info["numbers"]
    >>> ways = {a + b: f"{a} + {b}", a - b: f"{a} - {b}", b - a: f"{b} - {a}", a * b: f"{a}*{b}"}
    >>> answer = f"<answer>{ways[info['target']]}</answer>"
    >>> obs, reward, terminated, truncated, info = env.step(answer)
    >>> reward, terminated, info["success"]
    (1.0, True, True)
    """
    if not (isinstance(level, int) and 0 <= level < len(COUNTDOWN_LEVELS)):
        raise ValueError(f"level must be an int in [0, {len(COUNTDOWN_LEVELS) - 1}], got {level!r}")
    for name, value, low in (("num_count", num_count, 2), ("max_number", max_number, 1)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < low
        ):
            raise ValueError(f"{name} must be None or an int >= {low}, got {value!r}")
    if isinstance(max_target, bool) or not isinstance(max_target, int) or max_target < 1:
        raise ValueError(f"max_target must be an int >= 1, got {max_target!r}")
    reward = CountdownReward(answer_format, correct_reward, format_reward)
    generate = functools.partial(
        countdown_problem, num_count=num_count, max_number=max_number, max_target=max_target
    )
    source = ProceduralSource(generate, num_levels=len(COUNTDOWN_LEVELS), level=level, seed=seed)
    prompt = (
        COUNTDOWN_SYSTEM_PROMPT
        if answer_format == "tags"
        else system_prompt(_DESCRIPTION, answer_format, _HINT.replace("ONLY", "only"))
    )
    task = {"system_prompt": prompt, "reward": functools.partial(_score, reward)}
    return task_env(source, task, env_kwargs, seed=seed)


def make_countdown_vector_env(num_envs: int = 1, **kwargs: Any) -> DatasetChatVectorEnv:
    """``LLMChat-Countdown-v0``'s ``vector_entry_point``: N Countdown conversations."""
    return DatasetChatVectorEnv(make_countdown_env(**kwargs), num_envs)
