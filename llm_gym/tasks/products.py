"""Products (``LLMChat-Products-v0``): multiply two large numbers, a task the default model
cannot do in its head but can do with the ``python`` tool (docs: envs/tools.md)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np

from llm_gym.checks import check_bool
from llm_gym.rewards.answers import score_answer, system_prompt
from llm_gym.rubrics import TaskScore, answer_rubric
from llm_gym.sources.procedural import ProceduralSource
from llm_gym.tasks.task import Task, reward_version

__all__ = ["PRODUCTS_CODE_REQUEST", "products_problem", "products_task"]

# Digits of each factor, per level.
_DIGITS = (2, 3, 4, 5, 6)
_DESCRIPTION = "The user asks for the product of two numbers."
# SmolLM2-135M-Instruct writes no tool call for a system prompt's tool block (0 calls in
# every variant tried, hermes or markdown, with or without a worked example) but answers a
# request for code in the user's own message with a ```python block: the markdown format's
# tool call.
PRODUCTS_CODE_REQUEST = "Write a Python program in a ```python code block that prints the answer."


def products_problem(seed: int, index: int, level: int, *, ask_for_code: bool = True) -> dict:
    """Problem ``index`` of ``seed`` at ``level``: ``query`` and ``answer`` (a str).

    >>> problem = products_problem(0, 0, 0, ask_for_code=False)
    >>> a, b = (int(n) for n in problem["query"][8:-1].split(" * "))
    >>> str(a * b) == problem["answer"], 10 <= a < 100
    (True, True)
    """
    digits = _DIGITS[level]
    rng = np.random.default_rng([seed, index])
    a, b = (int(n) for n in rng.integers(10 ** (digits - 1), 10**digits, size=2))
    query = f"What is {a} * {b}?"
    if ask_for_code:
        query = f"{query} {PRODUCTS_CODE_REQUEST}"
    return {"query": query, "answer": str(a * b)}


def _grade(answer: str, item: Mapping[str, Any]) -> bool:
    return answer.replace(",", "").removesuffix(".0") == item["answer"]


def _score(answer_format: str, response: str, item: Mapping[str, Any]) -> TaskScore:
    score = score_answer(
        response, answer_format, functools.partial(_grade, item=item), format_reward=0.0
    )
    info = score.info() | {"answer": item["answer"]}
    return TaskScore(score.reward, info, answered=score.reward_answer > 0)


def products_task(
    *, level: int = 2, answer_format: str = "last_number", ask_for_code: bool = True
) -> Task:
    """Products: the exact product of two random numbers of the same length.

    ## Description

    Each episode asks for ``a * b``, and by default asks for a Python program in a
    ```` ```python ```` block that prints it: with ``tools=["python"]`` and
    ``tool_format="markdown"`` the block runs in the sandbox, its output comes back as a
    ``tool`` message, and the next turn answers. Without tools the block is just text.

    ## Rewards

    1.0 when the answer (``answer_format``, by default the response's last number) is the
    product, else 0.0. ``info``: TorchRL's parts and ``answer`` (the product, a str).

    ## Arguments

    - ``level``: 0 to 4, the digits of each factor (2 to 6); 2 (4 digits) by default.
    - ``answer_format``: ``"last_number"`` (default), ``"tags"``, ``"boxed"`` or ``"hash"``.
    - ``ask_for_code``: end each question with ``PRODUCTS_CODE_REQUEST``.

    ## Version History

    - v0: Initial version.

    ## Example

    >>> import gymnasium as gym, llm_gym
    >>> env = gym.make("LLMChat-Products-v0", tools=["python"], tool_format="markdown", seed=0)
    >>> obs, info = env.reset(seed=0)
    >>> question = obs["history"][-1]["content"]
    >>> code = "print(" + question[8 : question.index("?")] + ")"
    >>> obs, reward, terminated, truncated, info = env.step(f"```python\\n{code}\\n```")
    >>> obs["history"][-1]["content"] == env.unwrapped.item["answer"] + "\\n", reward
    (True, 0.0)
    >>> tool_output = obs["history"][-1]["content"]
    >>> obs, reward, terminated, truncated, info = env.step(f"It is {tool_output}")
    >>> reward, terminated, info["num_tool_calls"]
    (1.0, True, 1)
    """
    prompt = system_prompt(_DESCRIPTION, answer_format)  # checks answer_format
    generate = functools.partial(
        products_problem, ask_for_code=check_bool("ask_for_code", ask_for_code)
    )
    return Task(
        source=ProceduralSource(generate, num_levels=len(_DIGITS), level=level),
        prompt=prompt,
        reward=answer_rubric(functools.partial(_score, answer_format), answer_format),
        answer_format=answer_format,
        reward_version=reward_version("1"),
    )
