"""MATH scoring, TorchRL's ``MATHRewardParser`` rules: ``math-verify`` equivalence of the
answer and the solution's last ``\\boxed{}``, 1.0 / 0.1 / 0.0.

``math-verify`` (the ``math`` extra; TorchRL and TRL use it) compares answers symbolically
(``check_math``, ``math_equal``). Model output is hostile input: ``9^{9^{9}}`` is nine
characters and a power tower sympy would compute for minutes, holding the GIL. So every
check is bounded wherever it runs (main thread, worker thread, Ray actor):

- an answer longer than ``MAX_ANSWER_LENGTH`` is refused unread;
- math-verify runs in a separate worker process, never in this one: its own timeouts use
  ``signal.alarm``, which only a main thread may set, and a signal cannot stop a long C
  computation anyway. The worker is killed at ``timeout`` (plus a second), and this
  process only waits on a pipe meanwhile, the GIL free;
- in the worker, numbers too large to compute (an estimated ``MAX_DIGITS`` digits or more:
  power towers, factorials of large numbers) are refused before math-verify evaluates.

A refused or timed-out answer scores 0 (not the format reward), with the reason in the
reward's ``info["reason"]``.

>>> math_equal("0.5", "\\\\frac{1}{2}")
True
>>> MATHReward(mode="boxed")(r"so \\boxed{\\dfrac12}", r"... \\boxed{\\frac{1}{2}}").success
True
>>> check_math(r"9^{9^{9}}", "3").reason
'refused: about 3.7e+08 digits to compute (the limit is 100000)'
"""

from __future__ import annotations

import atexit
import functools
import importlib.util
import json
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llm_gym.checks import check_int, check_number, check_str
from llm_gym.rewards.answers import (
    AnswerReward,
    AnswerScore,
    Ungraded,
    extract_answer,
    trl_rows,
)

__all__ = [
    "MATH_TIMEOUT_S",
    "MAX_ANSWER_LENGTH",
    "MAX_DIGITS",
    "MATHReward",
    "MathVerdict",
    "boxed_answer",
    "check_math",
    "math_equal",
    "math_reward_func",
]

MAX_ANSWER_LENGTH = 512
MAX_DIGITS = 100_000  # far above any competition answer; computing it takes milliseconds
MATH_TIMEOUT_S = 5.0  # seconds one answer check may take
_KILL_GRACE_S = 1.0  # the worker's own alarm stops most checks; past this it is killed
_START_TIMEOUT_S = 120.0  # importing sympy on a loaded machine
_WORKER_MEMORY = 2 << 30  # bytes of address space: a huge number fails there, not here

# The worker: reads [predicted, reference, seconds, max_digits] lines, writes
# [equal, reason] lines. Its alarm raises a BaseException, which math-verify's
# `except Exception` blocks let through.
_WORKER = r'''
import json, math, os, resource, signal, sys

replies = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)  # anything math-verify or sympy prints goes where stderr goes, not to replies
hard = resource.getrlimit(resource.RLIMIT_AS)[1]
unlimited = hard == resource.RLIM_INFINITY
resource.setrlimit(resource.RLIMIT_AS, (MEMORY if unlimited else min(MEMORY, hard), hard))


class Late(BaseException):
    pass


def on_alarm(signum, frame):
    raise Late


signal.signal(signal.SIGALRM, on_alarm)
signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the parent, which kills this
try:
    import logging

    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    from math_verify import parse, verify
    import sympy
except BaseException as error:
    replies.write(json.dumps(f"{type(error).__name__}: {error}") + "\n")
    raise SystemExit(1)

# Functions whose value has about n log10(n) digits (at most) for an argument n.
GROWING = tuple(
    kind for kind in (getattr(sympy, name, None) for name in (
        "factorial", "factorial2", "subfactorial", "binomial", "gamma", "RisingFactorial",
        "FallingFactorial", "fibonacci", "lucas", "catalan", "bell", "harmonic", "bernoulli",
        "euler", "partition",
    )) if isinstance(kind, type)
)


def size(expr):
    """An upper bound on log10 of the largest number computing `expr` exactly may make
    (about its digits; inf: too many to say). A symbol counts as 1."""
    if isinstance(expr, sympy.Rational):  # Integer too
        return max(math.log10(abs(expr.p) or 1), math.log10(expr.q), 0.0)
    if isinstance(expr, sympy.Pow):
        base, exponent = size(expr.base), size(expr.exp)
        if expr.base.has(sympy.Float) or not expr.exp.is_number:
            return base + exponent  # floats keep their precision; a symbol stays symbolic
        return base * 10.0 ** exponent if exponent < 300 else math.inf  # |e| <= 10^size(e)
    if isinstance(expr, GROWING):
        largest = max((size(arg) for arg in expr.args), default=0.0)
        return 10.0 ** largest * max(largest, 1.0) if largest < 300 else math.inf
    args = getattr(expr, "args", ())
    if not isinstance(expr, sympy.Basic) or not args:
        return 0.0 if isinstance(expr, sympy.Number) else 1.0
    if isinstance(expr, sympy.Mul):
        return sum(size(arg) for arg in args)
    return max(size(arg) for arg in args) + (1.0 if isinstance(expr, sympy.Add) else 0.0)


def check(predicted, reference, max_digits):
    gold = parse("$" + reference + "$", parsing_timeout=None)
    guess = parse("$" + predicted + "$", parsing_timeout=None)
    sides = (("", guess), (" in the reference", gold)) if max_digits is not None else ()
    for side, parsed in sides:
        for expr in parsed:
            try:
                digits = size(expr) + 1 if isinstance(expr, sympy.Basic) else 0.0
            except Exception:  # a form the estimate does not know: the time limit bounds it
                digits = 0.0
            if digits > max_digits:
                count = f"about {digits:.2g}" if digits < math.inf else "too many"
                why = f"{count} digits to compute{side} (the limit is {max_digits})"
                return [False, "refused: " + why]
    return [bool(gold and guess and verify(gold, guess, timeout_seconds=None)), None]


replies.write(json.dumps("ready") + "\n")
for line in sys.stdin:
    try:
        predicted, reference, seconds, max_digits = json.loads(line)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            verdict = check(predicted, reference, max_digits)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except Late:
        verdict = [False, f"timed out: the check ran past {seconds:g} s"]
    except BaseException as error:  # MemoryError, RecursionError, a parse failure
        verdict = [False, f"{type(error).__name__} while checking"]
        if isinstance(error, Exception) and not isinstance(error, (MemoryError, RecursionError)):
            verdict = [False, None]  # math-verify could not read it: compare the strings
    replies.write(json.dumps(verdict) + "\n")
'''.replace("MEMORY", str(_WORKER_MEMORY))


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


@dataclass(frozen=True)
class MathVerdict:
    """Whether two answers are the same; ``reason``: why the answer was not checked (refused
    unread or unevaluated, or timed out), None when it was."""

    equal: bool
    reason: str | None = None


class _Worker:
    """One math-verify process: a request at a time, each answered by a deadline or the
    process is killed."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", _WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        _LIVE.add(self)
        self.buffer = b""
        ready = self.reply(time.monotonic() + _START_TIMEOUT_S)
        if ready != "ready":
            self.kill()
            why = ready if isinstance(ready, str) else "no answer"
            raise RuntimeError(f"the math-verify worker did not start: {why}")

    def ask(self, request: list[Any], timeout: float) -> Any:
        """The reply to ``request``; None (and the worker killed) past ``timeout`` s or when
        the worker died."""
        try:
            self.process.stdin.write(json.dumps(request).encode() + b"\n")
            self.process.stdin.flush()
        except OSError:
            self.kill()
            return None
        return self.reply(time.monotonic() + timeout)

    def reply(self, deadline: float) -> Any:
        fd = self.process.stdout.fileno()
        while b"\n" not in self.buffer:
            remaining = deadline - time.monotonic()
            # select waits with the GIL released: other threads run meanwhile.
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                self.kill()
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:  # the worker died
                self.kill()
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def kill(self) -> None:
        _LIVE.discard(self)
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            try:
                pipe.close()
            except OSError:
                pass


_LIVE: set[_Worker] = set()  # every worker started here, to kill at exit
_IDLE: list[_Worker] = []
_LOCK = threading.Lock()


def _forget_workers() -> None:
    # A forked child must not share its parent's workers (nor their pipes).
    global _LOCK
    _LIVE.clear()
    _IDLE.clear()
    _LOCK = threading.Lock()


def _kill_workers() -> None:
    for worker in list(_LIVE):
        worker.kill()


os.register_at_fork(after_in_child=_forget_workers)
atexit.register(_kill_workers)


@functools.cache
def _have_math_verify() -> bool:
    return importlib.util.find_spec("math_verify") is not None


def _verify(predicted: str, reference: str, timeout: float, max_digits: int | None) -> MathVerdict:
    """math-verify's verdict from a worker process, within ``timeout`` s (plus the grace)."""
    with _LOCK:
        worker = _IDLE.pop() if _IDLE else None
    if worker is None:
        worker = _Worker()  # one per concurrent check; they stay for the next ones
    reply = worker.ask([predicted, reference, timeout, max_digits], timeout + _KILL_GRACE_S)
    if reply is None:
        return MathVerdict(False, f"timed out: the check ran past {timeout:g} s and was killed")
    with _LOCK:
        _IDLE.append(worker)
    equal, reason = reply
    return MathVerdict(bool(equal), reason)


def check_math(
    predicted: str,
    reference: str,
    *,
    timeout: float = MATH_TIMEOUT_S,
    max_digits: int | None = MAX_DIGITS,
) -> MathVerdict:
    """Whether two answers are mathematically the same (``math-verify``: ``1/2``, ``0.5`` and
    ``\\frac{1}{2}`` are one answer), or equal as strings after TorchRL's normalization (what
    decides when math-verify is missing or cannot read them). A side holding a ``\\boxed{}``
    is read as its last box's content, as math-verify reads it, so an answer scores the same
    boxed or bare. Bounded by ``timeout``
    seconds wherever it runs; an answer refused or out of time is not equal, and ``reason``
    says why. ``max_digits``: refuse an answer (or reference) holding a number estimated to
    have more digits, before evaluating it (None: no estimate, the timeout alone).

    >>> check_math("2^3", "8")
    MathVerdict(equal=True, reason=None)
    >>> check_math(r"\\boxed{9^{9^{9}}}", "9^{9^{9}}")  # the same text: equal, not computed
    MathVerdict(equal=True, reason=None)
    >>> check_math("9" * 600, "3").reason
    'refused: the answer is over 512 characters'
    """
    check_str("predicted", predicted)
    check_str("reference", reference)
    check_number("timeout", timeout, low=0, strict=True)
    check_int("max_digits", max_digits, 1, optional=True)
    # A boxed answer is its box's content, on both sides and before any comparison: that is
    # what math-verify reads (its last \\boxed{}), so the string comparison below must read
    # it too, or "\\boxed{x}" and "x" would get different verdicts.
    predicted, reference = boxed_answer(predicted), boxed_answer(reference)
    if _normalize(predicted) == _normalize(reference):
        return MathVerdict(True)
    if len(predicted) > MAX_ANSWER_LENGTH:
        return MathVerdict(False, f"refused: the answer is over {MAX_ANSWER_LENGTH} characters")
    if not _have_math_verify():
        return MathVerdict(False)
    return _verify(predicted, reference, timeout, max_digits)


def math_equal(predicted: str, reference: str) -> bool:
    """``check_math(predicted, reference).equal``: whether two answers are mathematically the
    same; False for an answer refused or out of time."""
    return check_math(predicted, reference).equal


@dataclass(frozen=True)
class MATHReward(AnswerReward):
    """MATH scoring settings, validated once. ``reference`` may be a whole solution (its
    last ``\\boxed{}`` is the answer) or the answer itself. A refused or timed-out answer
    scores 0 with ``reason`` in the score."""

    def __call__(self, response: str, reference: str) -> AnswerScore:
        truth = boxed_answer(reference)

        def grade(answer: str) -> bool | Ungraded:
            verdict = check_math(answer, truth)
            return verdict.equal if verdict.reason is None else Ungraded(verdict.reason)

        return self.score(response, grade, numeric=False)


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
