"""Answer formats, one registry for every task: how a system prompt asks for the final
answer, where a response gives it, and how a graded answer becomes TorchRL's reward parts.

``ANSWER_FORMATS`` (also ``MODES``, the name ``GSM8KReward``'s ``mode`` has always used) holds
the formats; ``extract_answer`` says where each finds the answer. Extraction runs in time
linear in the response: model output is hostile input.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llm_gym.checks import check_reward, check_str

__all__ = [
    "ANSWER_FORMATS",
    "MODES",
    "AnswerFormat",
    "AnswerReward",
    "AnswerScore",
    "Ungraded",
    "check_answer_format",
    "completion_text",
    "extract_answer",
    "extract_tags",
    "score_answer",
    "system_prompt",
    "trl_rows",
]

# A signed number with optional thousands separators and decimals. The lookbehind stops a
# match from starting inside another number, so "5-3" reads as 5 and 3, not 5 and -3.
_NUMBER = r"(?<![\d.])[-+]?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)"
_NUMBER_RE = re.compile(_NUMBER)
_HASH_NUMBER_RE = re.compile(r"\s*\$?\s*(" + _NUMBER + ")")
_BOXED_RE = re.compile(r"\\boxed\s*\{")


def _between(text: str, start: str, end: str) -> str:
    # The first `start` and the first `end` after it: what re.search(start(.*?)end, DOTALL)
    # finds, without the regex's quadratic retries on a text full of unclosed `start`s.
    i = text.find(start)
    if i < 0:
        return ""
    j = text.find(end, i + len(start))
    return "" if j < 0 else text[i + len(start) : j].strip()


def extract_tags(text: str) -> tuple[str, str]:
    """Return the ``(think, answer)`` contents, stripped; ``""`` for a missing tag.

    TorchRL's rule (the first ``<answer>`` with a closing tag after it), not an XML parser:
    model output is rarely valid XML.

    >>> extract_tags("<think>some reasoning</think> <answer>42</answer>")
    ('some reasoning', '42')
    >>> extract_tags("<answer>1 < 2 & 3</answer><answer>9</answer>")
    ('', '1 < 2 & 3')
    """
    check_str("text", text)
    return _between(text, "<think>", "</think>"), _between(text, "<answer>", "</answer>")


def _last_boxed(text: str) -> str | None:
    # One pass with a stack of open braces: the latest \boxed{ whose brace closes wins, and
    # nested braces such as \boxed{\frac{1}{2}} come out whole.
    starts = {m.end() - 1: m.end() for m in _BOXED_RE.finditer(text)}
    if not starts:
        return None
    stack: list[int] = []
    best: tuple[int, int] | None = None
    for i, char in enumerate(text):
        if char == "{":
            stack.append(i)
        elif char == "}" and stack:
            opened = stack.pop()
            if opened in starts and (best is None or opened > best[0]):
                best = (opened, i)
    return None if best is None else text[starts[best[0]] : best[1]]


def _after_last_hash(text: str, numeric: bool) -> str | None:
    # The last "####" followed by a number (GSM8K's rule, as a findall of that pattern would
    # give), or the rest of the last "####"'s line; one backward pass.
    i = text.rfind("####")
    if not numeric:
        return None if i < 0 else text[i + 4 :].split("\n", 1)[0]
    while i >= 0:
        number = _HASH_NUMBER_RE.match(text, i + 4)
        if number:
            return number.group(1)
        i = text.rfind("####", 0, i)
    return None


@dataclass(frozen=True)
class AnswerFormat:
    """One way of giving the final answer: the system prompt's ``instruction`` for it, and
    ``extract(text, numeric)``, which finds it in a response (None when there is none)."""

    instruction: str
    extract: Callable[[str, bool], str | None]


ANSWER_FORMATS: dict[str, AnswerFormat] = {
    "tags": AnswerFormat(
        "The assistant first thinks about the reasoning process in the mind and then "
        "provides the user with the answer.\nThe reasoning process and answer are enclosed "
        "within <think></think> and <answer></answer> tags, respectively,\ni.e., "
        "<think>reasoning process here</think> <answer>answer here</answer>.",
        lambda text, numeric: extract_tags(text)[1],
    ),
    "hash": AnswerFormat(
        "The assistant reasons step by step, then writes the final answer alone on the last "
        "line, after '#### '.",
        _after_last_hash,
    ),
    "boxed": AnswerFormat(
        "The assistant reasons step by step, then puts the final answer within \\boxed{}.",
        lambda text, numeric: _last_boxed(text),
    ),
    "last_number": AnswerFormat(
        "The assistant reasons briefly, then ends the response with the final answer as a number.",
        lambda text, numeric: (_NUMBER_RE.findall(text) or [None])[-1],
    ),
}
MODES = tuple(ANSWER_FORMATS)


def system_prompt(description: str, answer_format: str, answer_hint: str = "") -> str:
    """A task's system prompt: ``description`` (what the user asks), then how to answer in
    ``answer_format``, then ``answer_hint`` (e.g. "The answer should be a number.").

    >>> print(system_prompt("The user gives a sum.", "boxed"))
    A conversation between User and Assistant. The user gives a sum.
    The assistant reasons step by step, then puts the final answer within \\boxed{}.
    """
    instruction = ANSWER_FORMATS[check_answer_format(answer_format)].instruction
    head = f"A conversation between User and Assistant. {description}\n{instruction}"
    # TorchRL's prompts put the hint on the tags line: "... answer here</answer>. The answer
    # should be a number."
    separator = " " if answer_format == "tags" else "\n"
    return f"{head}{separator}{answer_hint}" if answer_hint else head


def extract_answer(text: str, mode: str = "tags", *, numeric: bool = True) -> str | None:
    """Extract the model's final answer from ``text``; ``None`` when there is none.

    ``mode`` is one of ``ANSWER_FORMATS``: ``"tags"`` (TorchRL's ``<think>``/``<answer>``; the
    first ``<answer>`` wins), ``"hash"`` (what follows the last ``####``), ``"boxed"`` (the
    last brace-matched ``\\boxed{...}``) or ``"last_number"``. ``numeric``: in ``"hash"``
    mode, take the number after the last ``####`` (GSM8K's rule) rather than the rest of its
    line. Blank content counts as no answer.

    >>> extract_answer("<think>x</think><answer> 18 </answer>")
    '18'
    >>> extract_answer("so 9 + 9 = 18\\n#### 18", mode="hash")
    '18'
    >>> extract_answer("#### (3 + 4) * 2\\n", mode="hash", numeric=False)
    '(3 + 4) * 2'
    >>> extract_answer(r"\\boxed{\\frac{1}{2}}", mode="boxed")
    '\\\\frac{1}{2}'
    >>> extract_answer("from 1,000 down to -3.5 dollars", mode="last_number")
    '-3.5'
    >>> extract_answer("no answer here") is None
    True
    """
    check_str("text", text)
    found = ANSWER_FORMATS[check_answer_format(mode, "mode")].extract(text, numeric)
    found = found.strip() if found is not None else None
    return found or None


@dataclass(frozen=True)
class AnswerScore:
    """TorchRL's reward parts: ``reward_answer`` / ``reward_think`` are 1.0 when a non-blank
    answer / ``<think>`` was found, ``reward`` equals ``reward_right``, ``success`` is
    correctness. ``reason``: why the answer was not graded (``Ungraded``), else None."""

    reward_answer: float
    reward_think: float
    reward_right: float
    reward: float
    success: bool
    reason: str | None = None

    def as_dict(self) -> dict[str, float | bool | str]:
        """The parts as a plain dict, in TorchRL's key order (``reason`` last, when set)."""
        return self.info()

    def info(self) -> dict[str, float | bool | str]:
        """The parts as a dict: what an env puts in ``info``."""
        parts: dict[str, float | bool | str] = {
            "reward_answer": self.reward_answer,
            "reward_think": self.reward_think,
            "reward_right": self.reward_right,
            "reward": self.reward,
            "success": self.success,
        }
        if self.reason is not None:
            parts["reason"] = self.reason
        return parts


@dataclass(frozen=True)
class Ungraded:
    """What a grade returns for an answer it would not or could not check (refused unread,
    too large to evaluate, out of time): it scores 0, not the format reward, and ``reason``
    goes to ``AnswerScore.reason``."""

    reason: str


def score_answer(
    response: str,
    mode: str,
    grade: Callable[[str], float | bool | Ungraded],
    *,
    correct_reward: float = 1.0,
    format_reward: float = 0.1,
    numeric: bool = True,
) -> AnswerScore:
    """Extract the answer in ``mode`` and grade it: TorchRL's 1.0 / 0.1 / 0.0 shape.

    ``grade(answer)`` says how right an extracted answer is, from 0 (wrong) to 1 (right),
    or returns ``Ungraded(reason)``. The reward is ``correct_reward`` for a right answer,
    ``max(format_reward, grade · correct_reward)`` for any other answer given, 0.0 when none
    was or it was ungraded; ``success`` is ``grade >= 1``.

    >>> score = score_answer("<answer>9^9^9</answer>", "tags", lambda a: Ungraded("too big"))
    >>> score.reward_answer, score.reward, score.reason
    (1.0, 0.0, 'too big')
    """
    predicted = extract_answer(response, mode, numeric=numeric)
    graded = 0.0 if predicted is None else grade(predicted)
    reason = graded.reason if isinstance(graded, Ungraded) else None
    grade_value = 0.0 if reason is not None else float(graded)
    if predicted is None or reason is not None:
        right = 0.0
    elif grade_value >= 1.0:
        right = correct_reward
    else:  # partial credit (reasoning-gym scores in [0, 1]) never falls below the floor
        right = max(format_reward, grade_value * correct_reward)
    return AnswerScore(
        reward_answer=float(predicted is not None),
        reward_think=float(bool(extract_tags(response)[0])),
        reward_right=float(right),
        reward=float(right),
        success=grade_value >= 1.0,
        reason=reason,
    )


def completion_text(completion: str | Sequence[Mapping[str, object]]) -> str:
    """The text a TRL completion holds: a string, or the last assistant message's content."""
    # TRL passes plain strings, or for conversational data the generated messages; with
    # tool calls there may be several, and the last assistant turn holds the final answer.
    if isinstance(completion, str):
        return completion
    if isinstance(completion, (list, tuple)) and all(isinstance(m, dict) for m in completion):
        turns = [m for m in completion if m.get("role", "assistant") == "assistant"]
        if not turns:
            roles = [m.get("role") for m in completion]
            raise ValueError(f"completion must hold an assistant message, got roles {roles}")
        content = turns[-1].get("content")
        if isinstance(content, list):  # multimodal parts: keep the text ones
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        return content if isinstance(content, str) else ""
    raise TypeError(
        f"completion must be a str or a list of message dicts, got {type(completion).__name__}"
    )


@dataclass(frozen=True)
class AnswerReward:
    """A task reward's settings, validated once: the answer format it reads (``mode``) and
    its values. Each task's reward subclasses it with a ``__call__`` that grades the answer
    (``GSM8KReward``, ``CountdownReward``, ``MATHReward``)."""

    mode: str = "tags"
    correct_reward: float = 1.0
    format_reward: float = 0.1

    def __post_init__(self) -> None:
        check_answer_format(self.mode, "mode")
        check_reward("correct_reward", self.correct_reward)
        check_reward("format_reward", self.format_reward)

    def score(
        self,
        response: str,
        grade: Callable[[str], float | bool | Ungraded],
        *,
        numeric: bool = True,
    ) -> AnswerScore:
        """``score_answer`` of ``response`` with these settings."""
        check_str("response", response)
        return score_answer(
            response,
            self.mode,
            grade,
            correct_reward=self.correct_reward,
            format_reward=self.format_reward,
            numeric=numeric,
        )


def trl_rows(completions: Sequence[Any], **columns: Sequence[Any]) -> list[tuple[Any, ...]]:
    """TRL's batch as rows: each completion's text, then its value of each dataset column.

    >>> trl_rows(["a", [{"role": "assistant", "content": "b"}]], answer=["1", "2"])
    [('a', '1'), ('b', '2')]
    """
    for name, column in (("completions", completions), *columns.items()):
        if isinstance(column, str) or not isinstance(column, Sequence):
            raise TypeError(f"{name} must be a list, got {type(column).__name__}")
        if len(column) != len(completions):
            raise ValueError(
                f"completions and {name} must have the same length, "
                f"got {len(completions)} and {len(column)}"
            )
    texts = [completion_text(c) for c in completions]
    return list(zip(texts, *columns.values(), strict=True))


def check_answer_format(value: object, name: str = "answer_format") -> str:
    """``value`` if it names one of ``ANSWER_FORMATS``."""
    if value not in ANSWER_FORMATS:
        raise ValueError(
            f"{name} must be one of {', '.join(map(repr, ANSWER_FORMATS))}; got {value!r}"
        )
    return value
