"""Countdown (``LLMChat-Countdown-v0``): reach a target from a few numbers with + - * /,
TorchRL's game, generated offline at a level."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np

from llm_gym.checks import check_int
from llm_gym.rewards.answers import system_prompt
from llm_gym.rewards.countdown import CountdownReward
from llm_gym.rubrics import TaskScore, answer_rubric
from llm_gym.sources.procedural import ProceduralSource
from llm_gym.tasks.task import Task, reward_version

__all__ = [
    "COUNTDOWN_LEVELS",
    "COUNTDOWN_SYSTEM_PROMPT",
    "countdown_problem",
    "countdown_task",
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


def _score(reward: CountdownReward, response: str, item: Mapping[str, Any]) -> TaskScore:
    target, numbers = item["target"], item["numbers"]
    score = reward(response, target, numbers)
    info = score.info() | {"target": target, "numbers": list(numbers)}
    return TaskScore(score.reward, info, answered=score.reward_answer > 0)


def countdown_task(
    *,
    level: int = DEFAULT_LEVEL,
    num_count: int | None = None,
    max_number: int | None = None,
    max_target: int = 1000,
    answer_format: str = "tags",
    correct_reward: float = 1.0,
    format_reward: float = 0.1,
) -> Task:
    """Countdown: an expression over the given numbers that equals the target (TorchRL's
    ``CountdownEnv``).

    ## Description

    Each episode gives a few numbers and a target reachable from them; the policy answers
    with an arithmetic expression using each number at most once.

    ## Rewards

    TorchRL's ``CountdownRewardParser``: ``correct_reward`` (1.0) for an expression of
    ``+ - * /``, parentheses and the given numbers equal to the target, ``format_reward``
    (0.1) for another answer, 0.0 for none; parsed, never ``eval``ed. ``info``: TorchRL's
    parts, ``target`` (int) and ``numbers`` (list of int), also at reset.

    ## Arguments

    - ``level``: 0 to 6, the count and size of the numbers (``COUNTDOWN_LEVELS``); 4 is
      TorchRL's game (4 numbers up to 100). The env's ``set_level`` changes it.
    - ``num_count`` / ``max_number``: fix the count or the largest number whatever the level.
    - ``max_target``: targets above it become the sum of the numbers (TorchRL's rule).
    - ``answer_format``: ``"tags"`` (TorchRL's prompt), ``"boxed"`` or ``"hash"``;
      ``correct_reward`` / ``format_reward``: the reward values.

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
    check_int("num_count", num_count, 2, optional=True)
    check_int("max_number", max_number, 1, optional=True)
    check_int("max_target", max_target, 1)
    reward = CountdownReward(answer_format, correct_reward, format_reward)
    generate = functools.partial(
        countdown_problem, num_count=num_count, max_number=max_number, max_target=max_target
    )
    prompt = COUNTDOWN_SYSTEM_PROMPT
    if answer_format != "tags":
        prompt = system_prompt(_DESCRIPTION, answer_format, _HINT.replace("ONLY", "only"))
    return Task(
        source=ProceduralSource(generate, num_levels=len(COUNTDOWN_LEVELS), level=level),
        prompt=prompt,
        reward=answer_rubric(functools.partial(_score, reward), answer_format, numeric=False),
        answer_format=answer_format,
        reward_version=reward_version("1"),
    )
