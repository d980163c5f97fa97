"""``Rubric``: a reward made of named parts, as verifiers' ``Rubric`` and OpenEnv's rubrics.

A part is a small function of one response and its item (``part(response, item) -> float``,
or a ``TaskScore`` / ``(reward, info)`` pair, sync or async), or of a whole group
(``part(responses, items) -> [float, ...]``: a ranking, a diversity bonus). Each part has a
role:

- ``"reward"``: paid, times its weight;
- ``"metric"``: reported in ``info``, never paid (verifiers' weight 0);
- ``"gate"``: must hold (be > 0) for anything to be paid: a format, a length limit
  (OpenEnv's ``Gate``).

The rubric's reward is ``Σ weight · value`` over the reward parts when every gate holds, else
0.0; each part's value goes into ``info`` under its name. A ``Rubric`` is a ``TaskReward``:
a ``Task`` or a ``DatasetChatEnv`` takes it wherever it takes a reward.

An async part is bounded by ``timeout_s`` (past it, 0.0 with the reason in
``info["rubric_errors"]``); a part that raises fails the step (``errors="raise"``, the
default, as any reward) or scores 0.0 with its error (``errors="zero"``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import inspect
import math
import numbers
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from llm_gym.checks import check_choice, check_number, check_str
from llm_gym.rewards.answers import check_answer_format, extract_answer
from llm_gym.rubrics.score import TaskScore

__all__ = [
    "TASK_PART", "GroupPartFn", "Part", "PartFn", "ROLES", "Rubric", "answer_rubric",
    "extend_reward", "in_thread",
]  # fmt: skip

ROLES = ("reward", "metric", "gate")
TASK_PART = "task_score"  # the part a task's plain reward function becomes in extend_reward

#: ``part(response, item)``: a number, a ``TaskScore`` or ``(reward, info)``; may be async.
PartFn = Callable[[str, Mapping[str, Any]], Any]
#: ``part(responses, items)``: one number per response of the group; may be async.
GroupPartFn = Callable[[Sequence[str], Sequence[Mapping[str, Any]]], Any]

_Value = tuple[float, dict[str, Any], bool, Exception | None]  # value, info, answered, error


@dataclass(frozen=True)
class Part:
    """One named part of a ``Rubric``: its function, weight and role; ``group=True`` for a
    function of the whole group (``GroupPartFn``)."""

    name: str
    fn: PartFn | GroupPartFn
    weight: float = 1.0
    role: Literal["reward", "metric", "gate"] = "reward"
    group: bool = False

    def __post_init__(self) -> None:
        if not check_str("name", self.name):
            raise ValueError("a rubric part needs a name, got ''")
        if not callable(self.fn):
            raise TypeError(
                f"part {self.name!r}: fn must be callable, got {type(self.fn).__name__}"
            )
        check_number(f"part {self.name!r}: weight", self.weight)
        check_choice(f"part {self.name!r}: role", self.role, ROLES)


class Rubric:
    """A reward made of named parts (see the module).

    Args:
        parts: the ``Part``s, in the order ``info`` lists them (names unique).
        timeout_s: how long an async part may take for one response (or one group) before
            it scores 0.0 with a time-out error (None: no bound).
        errors: what a part that raises does: ``"raise"`` (the default: the step raises
            and, as any reward's error, changes nothing; a part that rejects its item's data
            or has a bug is the caller's to see) or ``"zero"`` (that part scores 0.0 for that
            response, the error in ``info["rubric_errors"]``: for parts that may fail on
            what a model writes, or on a flaky judge server). A time-out is always a 0.0.

    >>> def correct(response, item):
    ...     return float(response.strip() == item["answer"])
    >>> def short(response, item):
    ...     return float(len(response) <= 20)
    >>> rubric = Rubric([
    ...     Part("correct", correct, weight=1.0),
    ...     Part("short", short, role="gate"),
    ...     Part("length", lambda response, item: len(response), role="metric"),
    ... ])
    >>> rubric("4", {"answer": "4"})
    TaskScore(reward=1.0, info={'correct': 1.0, 'short': 1.0, 'length': 1.0}, answered=True)
    >>> rubric("4" + " " * 30, {"answer": "4"}).reward  # right, but the gate fails
    0.0

    A group part sees every response of a GRPO group at once:

    >>> def shortest(responses, items):
    ...     best = min(map(len, responses))
    ...     return [float(len(r) == best) for r in responses]
    >>> ranked = Rubric([Part("correct", correct), Part("shortest", shortest, 0.5, group=True)])
    >>> [s.reward for s in ranked.score_group(["4", " 4", "5"], [{"answer": "4"}] * 3)]
    [1.5, 1.0, 0.5]
    """

    def __init__(
        self, parts: Sequence[Part], *, timeout_s: float | None = None, errors: str = "raise"
    ) -> None:
        parts = tuple(parts)
        if not parts or not all(isinstance(p, Part) for p in parts):
            got = [type(p).__name__ for p in parts]
            raise TypeError(f"parts must be a non-empty list of Part, got {got}")
        names = [p.name for p in parts]
        if len(set(names)) != len(names):
            raise ValueError(f"part names must be unique, got {names}")
        self.parts = parts
        self.timeout_s = check_number("timeout_s", timeout_s, 0, strict=True, optional=True)
        self.errors = check_choice("errors", errors, ("raise", "zero"))

    def __repr__(self) -> str:
        shown = ", ".join(f"{p.name}:{p.role}{'' if p.role != 'reward' else f'×{p.weight:g}'}"
                          for p in self.parts)  # fmt: skip
        return f"Rubric({shown})"

    # -- scoring ----------------------------------------------------------------------------

    def __call__(self, response: str, item: Mapping[str, Any]) -> TaskScore:
        """The score of one response (its group parts, if any, skipped: they need the group;
        ``score_group`` runs them)."""
        (score,) = self.score_batch([response], [item], groups=False)
        return score

    def score_group(
        self, responses: Sequence[str], items: Sequence[Mapping[str, Any]]
    ) -> list[TaskScore]:
        """The scores of one group's responses, group parts included."""
        return self.score_batch(responses, items, groups=True)

    def score_batch(
        self,
        responses: Sequence[str],
        items: Sequence[Mapping[str, Any]],
        *,
        groups: bool | Sequence[Sequence[int]] = False,
    ) -> list[TaskScore]:
        """The scores of many responses at once, their async parts run concurrently.

        ``groups``: False (no group parts), True (all the responses are one group), or the
        indices of each group (``[[0, 1], [2, 3]]``: each index a response's, in one group at
        most; a response in none gets no group part). Anything else is a ``ValueError``
        naming ``groups``, what it holds and what is wrong with it."""
        if any(_is_async(p.fn) for p in self.parts):
            return _run(self.ascore_batch(responses, items, groups=groups))
        # All parts sync: no event loop, so a step's reward stays a plain function call.
        values: list[dict[str, _Value]] = [{} for _ in responses]
        for part, args, put in self._jobs(responses, items, groups, values):
            put(_sync_call(part, args))
        return [self._combine(found) for found in values]

    async def ascore_batch(
        self,
        responses: Sequence[str],
        items: Sequence[Mapping[str, Any]],
        *,
        groups: bool | Sequence[Sequence[int]] = False,
    ) -> list[TaskScore]:
        """``score_batch`` in a running event loop."""
        values: list[dict[str, _Value]] = [{} for _ in responses]

        async def run(part: Part, args: tuple, put: Callable[[Any], None]) -> None:
            put(await self._call(part, *args))

        await asyncio.gather(*(run(*job) for job in self._jobs(responses, items, groups, values)))
        return [self._combine(found) for found in values]

    def _jobs(
        self,
        responses: Sequence[str],
        items: Sequence[Mapping[str, Any]],
        groups: bool | Sequence[Sequence[int]],
        values: list[dict[str, _Value]],
    ) -> list[tuple[Part, tuple, Callable[[Any], None]]]:
        """Each call to make: its part, its arguments, and where its result goes."""
        if len(responses) != len(items):
            raise ValueError(
                f"responses and items must be as many, got {len(responses)} and {len(items)}"
            )
        groups = _check_groups(groups, len(responses))
        jobs = []
        for part in self.parts:
            if part.group:
                for members in groups:
                    args = ([responses[i] for i in members], [items[i] for i in members])
                    put = functools.partial(_put_group, part.name, list(members), values)
                    jobs.append((part, args, put))
            else:
                for i, args in enumerate(zip(responses, items, strict=True)):
                    jobs.append((part, args, functools.partial(_put, part.name, values[i])))
        return jobs

    async def _call(self, part: Part, *args: Any) -> Any:
        """The part's result, or the exception it raised (a time-out included)."""
        try:
            result = part.fn(*args)
            if inspect.isawaitable(result):
                # asyncio.wait, not wait_for: a TimeoutError the part raises itself is its
                # own error, not the rubric's time-out.
                task = asyncio.ensure_future(result)
                done, _ = await asyncio.wait({task}, timeout=self.timeout_s)
                if not done:
                    task.cancel()
                    limit = f"timeout_s={self.timeout_s:g}"
                    return TimeoutError(f"part {part.name!r} took longer than {limit}")
                result = task.result()
            return result
        except Exception as error:  # kept: _combine raises it or scores 0 (errors=)
            return error

    def _combine(self, found: Mapping[str, _Value]) -> TaskScore:
        info: dict[str, Any] = {}
        errors: dict[str, str] = {}
        total, gates, answered = 0.0, True, True
        for part in self.parts:
            if part.name not in found:  # a group part outside score_group
                continue
            value, part_info, part_answered, error = found[part.name]
            if error is not None:
                if self.errors == "raise" and not isinstance(error, TimeoutError):
                    if isinstance(error, ValueError) and "not a finite number" in str(error):
                        raise ValueError(f"rubric part {part.name!r} {error}")
                    raise error  # the part's own exception (a bug, or data it rejects)
                errors[part.name] = f"{type(error).__name__}: {error}"[:500]
            info.update(part_info)
            info[part.name] = value
            answered = answered and part_answered
            if part.role == "gate":
                gates = gates and value > 0
            elif part.role == "reward":
                paid = part.weight * value
                if not math.isfinite(paid) or not math.isfinite(total + paid):
                    # Finite parts, yet the reward would be inf: the part that tips it over
                    # fails, as one that returned inf would.
                    error = ValueError(
                        f"rubric part {part.name!r}: weight {part.weight:g} × value {value:g} "
                        f"makes the reward {total + paid:g}, not a finite number"
                    )
                    if self.errors == "raise":
                        raise error
                    errors[part.name] = f"ValueError: {error}"[:500]
                    info[part.name] = 0.0
                    continue
                total += paid
        if errors:
            info["rubric_errors"] = errors
        return TaskScore(total if gates else 0.0, info, answered and gates)


def _is_async(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` is an async function, or an object with an async ``__call__`` (a
    judge)."""
    call = getattr(fn, "__call__", None)  # noqa: B004  (the method itself is what is read)
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)


def _sync_call(part: Part, args: tuple) -> Any:
    """A sync part's result, or the exception it raised."""
    try:
        result = part.fn(*args)
        return _run(_awaited(result)) if inspect.isawaitable(result) else result
    except Exception as error:  # kept: _combine raises it or scores 0 (errors=)
        return error


async def _awaited(result: Awaitable[Any]) -> Any:
    return await result


def _put(name: str, found: dict[str, _Value], result: Any) -> None:
    found[name] = _value(result)


def _put_group(name: str, members: list[int], values: list[dict[str, _Value]], result: Any) -> None:
    """A group part's result, one value per member (a wrong count is each member's error)."""
    if isinstance(result, BaseException):
        outcome = [result] * len(members)
    elif (
        isinstance(result, (str, bytes))
        or not isinstance(result, Sequence)
        or (len(result) != len(members))
    ):
        error = ValueError(
            f"group part {name!r} must return one number per response ({len(members)}), "
            f"got {type(result).__name__}: {result!r:.80}"
        )
        outcome = [error] * len(members)
    else:
        outcome = list(result)
    for i, value in zip(members, outcome, strict=True):
        values[i][name] = _value(value)


def _value(result: Any) -> _Value:
    """A part's result as (value, info, answered, error): a number, a ``TaskScore`` or a
    ``(reward, info)`` pair; anything else (or a non-finite number) is an error worth 0."""
    if isinstance(result, Exception):
        return 0.0, {}, True, result
    info: dict[str, Any] = {}
    answered = True
    if isinstance(result, tuple) and len(result) in (2, 3) and isinstance(result[1], Mapping):
        score = TaskScore(*result)
        result, info, answered = score.reward, dict(score.info), bool(score.answered)
    # Any real number, numpy's scalars included (numbers.Real), but not a bool (np.bool_ is
    # no numbers.Real): a part that returns True meant something else.
    if isinstance(result, bool) or not isinstance(result, numbers.Real):
        error = ValueError(f"returned {result!r:.80}, not a finite number")
        return 0.0, info, answered, error
    try:
        value = float(result)
    except OverflowError:  # an int past float's range (2**2000)
        shown = f"an int of {len(str(abs(int(result))))} digits"
        error = ValueError(f"returned {shown}, too large for a float: not a finite number")
        return 0.0, info, answered, error
    if not math.isfinite(value):
        error = ValueError(f"returned {result!r:.80}, not a finite number")
        return 0.0, info, answered, error
    return value, info, answered, None


def _check_groups(groups: Any, count: int) -> list[list[int]]:
    """``score_batch``'s ``groups`` as lists of indices of the ``count`` responses, or a
    ``ValueError`` naming what is wrong.

    >>> _check_groups(True, 3), _check_groups(False, 3), _check_groups([(0, 2)], 3)
    ([[0, 1, 2]], [], [[0, 2]])
    >>> _check_groups([[0, 1], [1, 2], [5]], 3)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: groups must be True, False or lists of ... index 1 is in group 0 and group 1
    """
    if groups is True:
        return [list(range(count))] if count else []
    if groups is False:
        return []

    def wrong(problem: str) -> ValueError:
        expected = f"0 to {count - 1}" if count else "none: there are no responses"
        return ValueError(
            f"groups must be True, False or lists of response indices ({expected}, each in "
            f"one group at most), got {groups!r:.120}: {problem}"
        )

    if isinstance(groups, (str, bytes)) or not isinstance(groups, Sequence):
        raise wrong(f"a {type(groups).__name__}")
    seen: dict[int, int] = {}
    checked = []
    for g, members in enumerate(groups):
        if isinstance(members, (str, bytes)) or not isinstance(members, Sequence):
            raise wrong(f"group {g} is a {type(members).__name__}, not a list of indices")
        if not members:
            raise wrong(f"group {g} is empty")
        for i in members:
            if isinstance(i, bool) or not isinstance(i, numbers.Integral):
                raise wrong(f"group {g} holds {i!r:.40}, not an index")
            if not 0 <= i < count:
                raise wrong(f"index {i} in group {g} is out of range")
            if int(i) in seen:
                first = seen[int(i)]
                where = f"twice in group {g}" if first == g else f"in group {first} and group {g}"
                raise wrong(f"index {i} is {where}")
            seen[int(i)] = g
        checked.append([int(i) for i in members])
    return checked


def _run(coroutine: Awaitable[Any]) -> Any:
    """Run ``coroutine`` to its end from sync code, inside a running loop too (on a thread
    of its own: a vector env's step may be called from async code)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = asyncio.run(coroutine)
        except BaseException as error:  # re-raised in the caller's thread
            result["error"] = error

    thread = threading.Thread(target=target, name="llm_gym-rubric")
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


def answer_rubric(score: PartFn, answer_format: str, *, numeric: bool = True) -> Rubric:
    """A task's answer reward (TorchRL's 1.0 / 0.1 / 0.0 shape) as a ``Rubric``: the gate
    ``format`` (an answer in ``answer_format`` was given: ``extract_answer``'s rule, with its
    ``numeric``) and the reward ``right``, the task's ``score(response, item)``, whose
    ``TaskScore`` info (TorchRL's parts) the rubric's info keeps. The values are the task's
    own: without an answer its score is 0.0 already."""
    check_answer_format(answer_format, "answer_format")
    answered = functools.partial(_answered, answer_format, numeric)  # picklable, unlike a closure
    return Rubric([Part("format", answered, role="gate"), Part("right", score)])


def _answered(answer_format: str, numeric: bool, response: str, item: Mapping[str, Any]) -> float:
    return float(extract_answer(response, answer_format, numeric=numeric) is not None)


def in_thread(fn: Callable[..., Any], *args: Any) -> asyncio.Future:
    """``fn(*args)`` on a daemon thread of its own, as an awaitable: the body of an async
    part that blocks (a sandboxed program, a model's generate). Not a pool's thread: the
    calls of one ``score_batch`` all run at once, and a call that outlives its time-out is
    left to finish without holding up the event loop's shutdown or the interpreter's exit."""
    future: concurrent.futures.Future = concurrent.futures.Future()

    def target() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(fn(*args))
        except BaseException as error:  # handed to the awaiting coroutine
            future.set_exception(error)

    threading.Thread(target=target, name="llm_gym-part", daemon=True).start()
    return asyncio.wrap_future(future)


def extend_reward(
    reward: Callable[[str, Mapping[str, Any]], Any] | None,
    parts: Sequence[Part],
    *,
    task_weight: float = 1.0,
) -> Rubric:
    """A task's ``reward`` with more ``parts`` (a judge, a length metric) as one ``Rubric``.

    The task's own parts come first: a ``Rubric``'s parts as they are, a plain reward
    function as the part ``TASK_PART`` (None: no part). ``task_weight`` scales what they pay;
    at 0 they are all reported as metrics (gates included), so that only ``parts`` pay and
    the task's score is still seen. The task's ``timeout_s`` and ``errors`` are kept.

    >>> task = Rubric([Part("format", lambda r, i: float(r.isdigit()), role="gate"),
    ...                Part("right", lambda r, i: float(r == i["answer"]))])
    >>> brief = Part("brief", lambda r, i: float(len(r) < 3), weight=0.5)
    >>> extend_reward(task, [brief])
    Rubric(format:gate, right:reward×1, brief:reward×0.5)
    >>> extend_reward(task, [brief], task_weight=0)("5", {"answer": "4"}).reward
    0.5
    >>> extend_reward(lambda r, i: 1.0, [brief], task_weight=2)
    Rubric(task_score:reward×2, brief:reward×0.5)
    """
    task_weight = check_number("task_weight", task_weight, 0)
    if isinstance(reward, Rubric):
        own, options = reward.parts, {"timeout_s": reward.timeout_s, "errors": reward.errors}
    else:
        own, options = (() if reward is None else (Part(TASK_PART, reward),)), {}
    scaled = []
    for part in own:
        if task_weight == 0 and part.role != "metric":
            part = dataclasses.replace(part, role="metric")
        elif part.role == "reward":
            part = dataclasses.replace(part, weight=part.weight * task_weight)
        scaled.append(part)
    return Rubric([*scaled, *parts], **options)
