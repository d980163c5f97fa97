"""The argument checks every module uses: each error names the argument, what was expected
and what came, and nothing is changed before the check passes. A value of the wrong type
raises ``ArgumentTypeError`` (see there); one of the right type out of range, ``ValueError``.

>>> check_int("max_turns", 3, low=1)
3
>>> check_int("max_turns", 0, low=1)
Traceback (most recent call last):
...
ValueError: max_turns must be an int >= 1, got 0
>>> check_number("coef", float("nan"), low=0)
Traceback (most recent call last):
...
ValueError: coef must be a finite number >= 0, got nan
>>> check_choice("estimator", "k4", ("k1", "k2", "k3"))
Traceback (most recent call last):
...
ValueError: estimator must be one of ('k1', 'k2', 'k3'), got 'k4'
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any, TypeVar

import numpy as np

__all__ = [
    "ArgumentTypeError",
    "check_bool",
    "check_choice",
    "check_int",
    "check_number",
    "check_str",
]

T = TypeVar("T")


class ArgumentTypeError(TypeError, ValueError):
    """An argument of the wrong type: catch it as either ``TypeError`` or ``ValueError`` (as
    NumPy's ``AxisError`` is both a ``ValueError`` and an ``IndexError``)."""


def _bounds(low: float | None, high: float | None, *, strict: bool = False) -> str:
    if low is not None and high is not None:
        return f" in [{low}, {high}]"
    if low is not None:
        return f" {'>' if strict else '>='} {low}"
    return "" if high is None else f" <= {high}"


def check_int(
    name: str,
    value: Any,
    low: int | None = None,
    high: int | None = None,
    *,
    optional: bool = False,
) -> Any:
    """``value`` as an ``int`` in ``[low, high]`` (either bound may be None); None passes when
    ``optional``. ``bool`` is not an int here, NumPy integers are."""
    if value is None and optional:
        return None
    expected = f"{'None or ' if optional else ''}an int{_bounds(low, high)}"
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ArgumentTypeError(f"{name} must be {expected}, got {value!r:.80}")
    if (low is not None and value < low) or (high is not None and value > high):
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return int(value)


def check_number(
    name: str,
    value: Any,
    low: float | None = None,
    *,
    strict: bool = False,
    optional: bool = False,
) -> Any:
    """``value`` as a finite ``float`` ``>= low`` (``> low`` when ``strict``); None passes
    when ``optional``."""
    if value is None and optional:
        return None
    expected = f"{'None or ' if optional else ''}a finite number{_bounds(low, None, strict=strict)}"
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
        raise ArgumentTypeError(f"{name} must be {expected}, got {value!r:.80}")
    value = float(value)
    out = low is not None and (value <= low if strict else value < low)
    if not math.isfinite(value) or out:
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return value


def check_bool(name: str, value: Any) -> bool:
    """``value`` if it is a ``bool``."""
    if not isinstance(value, (bool, np.bool_)):
        raise ArgumentTypeError(f"{name} must be a bool, got {type(value).__name__}: {value!r:.80}")
    return bool(value)


def check_str(name: str, value: Any, *, optional: bool = False) -> Any:
    """``value`` if it is a ``str`` (or None when ``optional``)."""
    if (value is None and optional) or isinstance(value, str):
        return value
    expected = "a str or None" if optional else "a str"
    raise ArgumentTypeError(f"{name} must be {expected}, got {type(value).__name__}")


def check_choice(name: str, value: T, choices: Collection[Any]) -> T:
    """``value`` if it is one of ``choices``."""
    try:
        ok = value in choices
    except TypeError:  # an unhashable value looked up in a set or dict
        ok = False
    if not ok:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r:.80}")
    return value
