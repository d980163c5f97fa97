"""Countdown scoring, TorchRL's ``CountdownRewardParser`` rules with a safe evaluator.

The answer is an arithmetic expression over the given numbers, each used at most once, that
must equal the target. TorchRL ``eval``s any string of digits, operators and parentheses, so
``99**98**97`` never returns; here the expression is parsed with ``ast``, only ``+ - * /``,
parentheses and integer literals are allowed, the numbers are checked before anything is
computed, and the arithmetic is exact (fractions).
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from llm_gym.checks import check_str
from llm_gym.rewards._parsing import parse
from llm_gym.rewards.answers import AnswerReward, AnswerScore, trl_rows

__all__ = [
    "CountdownReward",
    "countdown_reward_func",
    "evaluate_expression",
    "score_countdown",
    "uses_numbers",
]

# Longer answers are not expressions over a handful of numbers; refusing them bounds the
# parse time whatever the model writes.
MAX_EXPRESSION_LENGTH = 512
# Decimal digits, the four operators, parentheses and spaces: no hex, exponent or "_" literals.
_CHARACTERS = re.compile(r"[\d\s+\-*/()]*")
_OPERATORS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
}


def _parse(expression: str) -> ast.expr | None:
    if len(expression) > MAX_EXPRESSION_LENGTH or not _CHARACTERS.fullmatch(expression):
        return None
    try:
        return parse(expression.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _literals(node: ast.expr) -> list[int] | None:
    """The integer literals of an expression of + - * / and parentheses; None otherwise."""
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _literals(node.left), _literals(node.right)
        return None if left is None or right is None else left + right
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return _literals(node.operand)  # "-3 + 5" uses 3 and 5, as TorchRL's eval reads it
    if isinstance(node, ast.Constant) and type(node.value) is int and node.value >= 0:
        return [node.value]
    return None


def _value(node: ast.expr) -> Fraction:
    if isinstance(node, ast.BinOp):
        return _OPERATORS[type(node.op)](_value(node.left), _value(node.right))
    if isinstance(node, ast.UnaryOp):
        return -_value(node.operand)
    return Fraction(node.value)


def evaluate_expression(expression: str) -> Fraction | None:
    """The exact value of an expression of decimal integers, ``+ - * /``, unary minus and
    parentheses; None for anything else (other operators, names, calls, a division by 0).

    >>> [evaluate_expression(e) for e in ("7 / 2", "2 ** 10", "__import__('os')", "1/0")]
    [Fraction(7, 2), None, None, None]
    """
    check_str("expression", expression)
    node = _parse(expression)
    if node is None or _literals(node) is None:
        return None
    try:
        return _value(node)
    except ZeroDivisionError:
        return None


def uses_numbers(expression: str, numbers: Sequence[int]) -> bool:
    """Whether ``expression`` is allowed and uses each of ``numbers`` at most once (and no
    other number).

    >>> uses_numbers("(25 + 3) * 4", [3, 4, 25, 7]), uses_numbers("3 * 3", [3, 4])
    (True, False)
    """
    node = _parse(expression)
    literals = None if node is None else _literals(node)
    return literals is not None and not Counter(literals) - Counter(numbers)


def _check_problem(target: Any, numbers: Any) -> None:
    if isinstance(target, bool) or not isinstance(target, int):
        raise TypeError(f"target must be an int, got {type(target).__name__}: {target!r:.40}")
    if isinstance(numbers, (str, bytes)) or not isinstance(numbers, Sequence):
        raise TypeError(f"numbers must be a list of int, got {type(numbers).__name__}")
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in numbers):
        raise TypeError(f"numbers must be a list of int, got {list(numbers)!r:.80}")


@dataclass(frozen=True)
class CountdownReward(AnswerReward):
    """Countdown scoring settings, validated once.

    >>> reward = CountdownReward(mode="boxed")
    >>> reward(r"so \\boxed{10 - 2}", target=8, numbers=[2, 10]).success
    True
    """

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mode == "last_number":
            raise ValueError(
                "mode must be one of 'tags', 'hash', 'boxed' for Countdown (its answer is an "
                "expression, not a number); got 'last_number'"
            )

    def __call__(self, response: str, target: int, numbers: Sequence[int]) -> AnswerScore:
        _check_problem(target, numbers)
        # The numbers are checked first: with at most len(numbers) literals of bounded size
        # the arithmetic that follows is tiny.
        return self.score(
            response,
            lambda expression: (
                uses_numbers(expression, numbers) and evaluate_expression(expression) == target
            ),
            numeric=False,
        )


def score_countdown(
    response: str, target: int, numbers: Sequence[int], *, mode: str = "tags"
) -> AnswerScore:
    """Score one response with the default values (1.0 / 0.1 / 0.0)."""
    return CountdownReward(mode)(response, target, numbers)


def countdown_reward_func(
    prompts: Sequence[object] | None,
    completions: Sequence[Any],
    target: Sequence[int],
    numbers: Sequence[Sequence[int]],
    **kwargs: object,
) -> list[float]:
    """Countdown reward for TRL's ``GRPOTrainer(reward_funcs=[countdown_reward_func])``: the
    dataset's ``target`` and ``numbers`` columns arrive by name.

    >>> countdown_reward_func(None, ["<answer>3 * 4</answer>"], target=[12], numbers=[[3, 4]])
    [1.0]
    """
    rows = trl_rows(completions, target=target, numbers=numbers)
    return [_DEFAULT(text, int(t), list(n)).reward for text, t, n in rows]


_DEFAULT = CountdownReward()
