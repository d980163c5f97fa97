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
from typing import TYPE_CHECKING, Literal, TypeVar, overload

import numpy as np

if TYPE_CHECKING:
    import torch

__all__ = [
    "CPU_BF16_VARIABLE",
    "ArgumentTypeError",
    "check_bool",
    "check_choice",
    "check_int",
    "check_number",
    "check_reward",
    "check_str",
    "check_tensor",
    "forced_cpu_bf16",
]

# The environment variable that says whether the CPU multiplies in bfloat16 fast (``--dtype
# auto``'s choice there), read by llm_gym.lm.precision; checked by the CLI before torch loads.
CPU_BF16_VARIABLE = "LLM_GYM_CPU_BF16"

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


@overload
def check_int(
    name: str,
    value: object,
    low: int | None = None,
    high: int | None = None,
    *,
    optional: Literal[False] = False,
) -> int: ...
@overload
def check_int(
    name: str, value: object, low: int | None = None, high: int | None = None, *, optional: bool
) -> int | None: ...
def check_int(
    name: str,
    value: object,
    low: int | None = None,
    high: int | None = None,
    *,
    optional: bool = False,
) -> int | None:
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


@overload
def check_number(
    name: str,
    value: object,
    low: float | None = None,
    *,
    strict: bool = False,
    optional: Literal[False] = False,
) -> float: ...
@overload
def check_number(
    name: str, value: object, low: float | None = None, *, strict: bool = False, optional: bool
) -> float | None: ...
def check_number(
    name: str,
    value: object,
    low: float | None = None,
    *,
    strict: bool = False,
    optional: bool = False,
) -> float | None:
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


def check_bool(name: str, value: object) -> bool:
    """``value`` if it is a ``bool``."""
    if not isinstance(value, (bool, np.bool_)):
        raise ArgumentTypeError(f"{name} must be a bool, got {type(value).__name__}: {value!r:.80}")
    return bool(value)


@overload
def check_str(name: str, value: object, *, optional: Literal[False] = False) -> str: ...
@overload
def check_str(name: str, value: object, *, optional: bool) -> str | None: ...
def check_str(name: str, value: object, *, optional: bool = False) -> str | None:
    """``value`` if it is a ``str`` (or None when ``optional``)."""
    if (value is None and optional) or isinstance(value, str):
        return value
    expected = "a str or None" if optional else "a str"
    raise ArgumentTypeError(f"{name} must be {expected}, got {type(value).__name__}: {value!r:.80}")


def check_choice(name: str, value: T, choices: Collection[object]) -> T:
    """``value`` if it is one of ``choices``."""
    try:
        ok = value in choices
    except TypeError:  # an unhashable value looked up in a set or dict
        ok = False
    if not ok:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r:.80}")
    return value


def check_reward(name: str, value: object) -> float:
    """``value`` as a finite float: a reward's value."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ArgumentTypeError(
            f"{name} must be an int or float, got {type(value).__name__}: {value!r:.80}"
        )
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return float(value)


def check_tensor(
    name: str, value: object, shape: tuple[int, ...], context: str = ""
) -> torch.Tensor:
    """``value`` if it is a ``torch.Tensor`` of ``shape`` (``context`` says whose shape)."""
    import torch  # only a caller that has tensors gets here: importing llm_gym stays light

    if not isinstance(value, torch.Tensor):
        raise ArgumentTypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.shape != shape:
        raise ValueError(f"{name} must have shape {shape}{context}, got {tuple(value.shape)}")
    return value


def forced_cpu_bf16() -> bool | None:
    """``LLM_GYM_CPU_BF16``: True where ``1``, False where ``0``, None unset (the CPU's own
    features decide); ``ValueError`` naming it for anything else.

    >>> import os; os.environ[CPU_BF16_VARIABLE] = "yes"
    >>> forced_cpu_bf16()
    Traceback (most recent call last):
    ...
    ValueError: LLM_GYM_CPU_BF16 must be '0', '1' or unset, got 'yes'
    >>> del os.environ[CPU_BF16_VARIABLE]; forced_cpu_bf16() is None
    True
    """
    import os

    forced = os.environ.get(CPU_BF16_VARIABLE, "").strip()
    if forced and forced not in ("0", "1"):
        raise ValueError(f"{CPU_BF16_VARIABLE} must be '0', '1' or unset, got {forced!r}")
    return None if not forced else forced == "1"
