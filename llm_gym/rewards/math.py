"""MATH scoring, TorchRL's ``MATHRewardParser`` rules: ``math-verify`` equivalence of the
answer and the solution's last ``\\boxed{}``, 1.0 / 0.1 / 0.0.

``math-verify`` (the ``math`` extra; TorchRL and TRL use it) compares answers symbolically
(``math_equal``). An answer longer than ``MAX_ANSWER_LENGTH`` is wrong unread, and
math-verify's own timeouts apply in the main thread, so a hostile answer is scored fast.

>>> math_equal("0.5", "\\\\frac{1}{2}")
True
>>> MATHReward(mode="boxed")(r"so \\boxed{\\dfrac12}", r"... \\boxed{\\frac{1}{2}}").success
True
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llm_gym.checks import check_str
from llm_gym.rewards.answers import (
    AnswerReward,
    AnswerScore,
    extract_answer,
    trl_rows,
)

__all__ = ["MAX_ANSWER_LENGTH", "MATHReward", "boxed_answer", "math_equal", "math_reward_func"]

MAX_ANSWER_LENGTH = 512
_TIMEOUT_S = 2


def boxed_answer(solution: str) -> str:
    """The content of a solution's last ``\\boxed{}``; the whole text, stripped, without one.

    >>> boxed_answer(r"so $x = \\boxed{\\frac{1}{2}}$.")
    '\\\\frac{1}{2}'
    """
    check_str("solution", solution)
    boxed = extract_answer(solution, "boxed")
    return solution.strip() if boxed is None else boxed


def _normalize(s: str) -> str:
    # TorchRL's _normalize_math.
    for old in (" ", ",", "$", "\\left", "\\right", "\\!", "\\,", "\\;", "\\:"):
        s = s.replace(old, "")
    return s


def math_equal(predicted: str, reference: str) -> bool:
    """Whether two answers are mathematically the same (``math-verify``: ``1/2``, ``0.5`` and
    ``\\frac{1}{2}`` are one answer), or equal as strings after TorchRL's normalization when
    it is missing or cannot tell."""
    check_str("predicted", predicted)
    check_str("reference", reference)
    if len(predicted) > MAX_ANSWER_LENGTH:
        return False
    # math-verify times out with signal.alarm, which only the main thread may set.
    timeout = _TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    try:
        from math_verify import parse, verify

        gold = parse(f"${reference}$", parsing_timeout=timeout)
        guess = parse(f"${predicted}$", parsing_timeout=timeout)
        if gold and guess and verify(gold, guess, timeout_seconds=timeout):
            return True
    except Exception:  # missing, or a parse or verify failure: compare the strings
        pass
    return _normalize(predicted.strip()) == _normalize(reference.strip())


@dataclass(frozen=True)
class MATHReward(AnswerReward):
    """MATH scoring settings, validated once. ``reference`` may be a whole solution (its
    last ``\\boxed{}`` is the answer) or the answer itself."""

    def __call__(self, response: str, reference: str) -> AnswerScore:
        truth = boxed_answer(reference)
        return self.score(response, lambda answer: math_equal(answer, truth), numeric=False)


def math_reward_func(
    prompts: Sequence[object] | None,
    completions: Sequence[Any],
    solution: Sequence[str],
    **kwargs: object,
) -> list[float]:
    """MATH reward for TRL's ``GRPOTrainer(reward_funcs=[math_reward_func])``: the dataset's
    ``solution`` column arrives by name.

    >>> math_reward_func(None, ["<answer>0.5</answer>"], solution=[r"\\boxed{\\frac12}"])
    [1.0]
    """
    return [_DEFAULT(text, s).reward for text, s in trl_rows(completions, solution=solution)]


_DEFAULT = MATHReward()
