"""GSM8K answer scoring, as TorchRL's ``GSM8KRewardParser`` does it, with no env needed.

The scoring mirrors ``torchrl/envs/llm/reward/gsm8k.py`` (regex tag extraction, answer
normalization, 1.0 / 0.1 / 0.0). Three extraction modes that TorchRL lacks ("hash", "boxed",
"last_number") let a model answer in other common formats; the scoring is the same.

>>> score_gsm8k("<think>2 + 2</think><answer>4</answer>", "2 + 2 = <<2+2=4>>4\\n#### 4").reward
1.0
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = [
    "MODES",
    "GSM8KReward",
    "GSM8KScore",
    "extract_answer",
    "extract_ground_truth",
    "extract_tags",
    "gsm8k_reward_func",
    "normalize_number",
    "score_gsm8k",
]

MODES = ("tags", "hash", "boxed", "last_number")

# TorchRL's patterns: the first match wins, and DOTALL lets the reasoning span lines.
_THINK_RE = re.compile(r"<think>(.*?)</think>", re.DOTALL)
_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
# A signed number with optional thousands separators and decimals. The lookbehind stops a
# match from starting inside another number, so "5-3" reads as 5 and 3, not 5 and -3.
_NUMBER = r"(?<![\d.])[-+]?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)"
_NUMBER_RE = re.compile(_NUMBER)
_HASH_RE = re.compile(r"####\s*\$?\s*(" + _NUMBER + ")")
_BOXED_RE = re.compile(r"\\boxed\s*\{")


def extract_tags(text: str) -> tuple[str, str]:
    """Return the ``(think, answer)`` contents, stripped; ``""`` for a missing tag.

    A regex rather than an XML parser, as in TorchRL: model output is rarely valid XML.

    >>> extract_tags("<think>some reasoning</think> <answer>42</answer>")
    ('some reasoning', '42')
    >>> extract_tags("<answer>1 < 2 & 3</answer><answer>9</answer>")
    ('', '1 < 2 & 3')
    """
    _check_str("text", text)
    think, answer = _THINK_RE.search(text), _ANSWER_RE.search(text)
    return (think.group(1).strip() if think else "", answer.group(1).strip() if answer else "")


def _last_boxed(text: str) -> str | None:
    # Walk back from the last \boxed{ to the first one whose braces close, counting depth
    # so that nested braces such as \boxed{\frac{1}{2}} come out whole.
    for match in reversed(list(_BOXED_RE.finditer(text))):
        depth = 1
        for i in range(match.end(), len(text)):
            depth += (text[i] == "{") - (text[i] == "}")
            if depth == 0:
                return text[match.end() : i]
    return None


def extract_answer(text: str, mode: str = "tags") -> str | None:
    """Extract the model's final answer from ``text``; ``None`` when there is none.

    Modes: ``"tags"`` the first ``<answer>...</answer>`` (TorchRL's rule), ``"hash"`` the
    number after the last ``####``, ``"boxed"`` the last brace-matched ``\\boxed{...}``,
    ``"last_number"`` the last number in the text. Blank content counts as no answer.

    >>> extract_answer("<think>x</think><answer> 18 </answer>")
    '18'
    >>> extract_answer("so 9 + 9 = 18\\n#### 18", mode="hash")
    '18'
    >>> extract_answer(r"\\boxed{\\frac{1}{2}}", mode="boxed")
    '\\\\frac{1}{2}'
    >>> extract_answer("from 1,000 down to -3.5 dollars", mode="last_number")
    '-3.5'
    >>> extract_answer("no answer here") is None
    True
    """
    _check_str("text", text)
    _check_mode(mode)
    if mode == "tags":
        found: str | None = extract_tags(text)[1]
    elif mode == "hash":
        found = (_HASH_RE.findall(text) or [None])[-1]
    elif mode == "boxed":
        found = _last_boxed(text)
    else:
        found = (_NUMBER_RE.findall(text) or [None])[-1]
    found = found.strip() if found is not None else None
    return found or None


def extract_ground_truth(answer_field: str) -> str:
    """Return what follows ``#### `` in a GSM8K ``answer`` field, stripped.

    A field without ``#### `` is taken to be an already-extracted answer such as ``"18"``,
    which is how many GRPO recipes preprocess the dataset.

    >>> extract_ground_truth("Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 eggs.\\n#### 18")
    '18'
    >>> extract_ground_truth(" 18 ")
    '18'
    """
    _check_str("answer_field", answer_field)
    return answer_field.rpartition("#### ")[2].strip()


def normalize_number(s: str) -> str:
    """Normalize an answer for comparison exactly as TorchRL's ``normalize_answer`` does.

    Strip whitespace, drop ``,`` ``$`` ``%``, drop trailing dots, then drop a decimal's
    trailing zeros. The strip comes first, so ``"$ 5"`` keeps its inner space.

    >>> [normalize_number(s) for s in ["1,234", "$120", "120.00", "3.14", "100%", "7."]]
    ['1234', '120', '120', '3.14', '100', '7']
    """
    _check_str("s", s)
    s = s.strip().replace(",", "").replace("$", "").replace("%", "").rstrip(".")
    if "." in s:  # only a decimal may lose zeros: "100" must stay "100"
        s = s.rstrip("0").rstrip(".")
    return s


@dataclass(frozen=True)
class GSM8KScore:
    """TorchRL's parts: ``reward_answer`` / ``reward_think`` are 1.0 when a non-blank answer /
    ``<think>`` was found, ``reward`` equals ``reward_right``, ``success`` is correctness."""

    reward_answer: float
    reward_think: float
    reward_right: float
    reward: float
    success: bool

    def as_dict(self) -> dict[str, float | bool]:
        """The parts as a plain dict, in TorchRL's key order."""
        return asdict(self)


def score_gsm8k(
    response: str,
    answer: str,
    *,
    mode: str = "tags",
    correct_reward: float = 1.0,
    format_reward: float = 0.1,
) -> GSM8KScore:
    """Score a model response against a GSM8K answer field (or a bare answer).

    ``correct_reward`` when the normalized answers match, ``format_reward`` when an answer
    was extracted but is wrong, 0.0 when none was. ``<think>`` is checked in every mode.

    >>> score = score_gsm8k("<think>a</think><answer>$1,800.00</answer>", "#### 1800")
    >>> score.reward, score.reward_answer, score.reward_think, score.success
    (1.0, 1.0, 1.0, True)
    >>> score_gsm8k("<answer>17</answer>", "#### 18").reward
    0.1
    """
    return GSM8KReward(mode, correct_reward, format_reward)(response, answer)


@dataclass(frozen=True)
class GSM8KReward:
    """The scoring settings, validated once, for an env to call per response.

    >>> reward = GSM8KReward(mode="boxed", correct_reward=2.0)
    >>> reward(r"so \\boxed{18}", "#### 18").reward
    2.0
    >>> reward.as_reward_func()(prompts=["q"], completions=["\\\\boxed{3}"], answer=["4"])
    [0.1]
    """

    mode: str = "tags"
    correct_reward: float = 1.0
    format_reward: float = 0.1

    def __post_init__(self) -> None:
        _check_mode(self.mode)
        _check_reward("correct_reward", self.correct_reward)
        _check_reward("format_reward", self.format_reward)

    def __call__(self, response: str, answer: str) -> GSM8KScore:
        _check_str("response", response)
        _check_str("answer", answer)
        truth = normalize_number(extract_ground_truth(answer))
        predicted = extract_answer(response, self.mode)
        success = predicted is not None and normalize_number(predicted) == truth
        right = self.correct_reward if success else self.format_reward if predicted else 0.0
        return GSM8KScore(
            reward_answer=float(predicted is not None),
            reward_think=float(bool(extract_tags(response)[0])),
            reward_right=float(right),
            reward=float(right),
            success=success,
        )

    def as_reward_func(self) -> Callable[..., list[float]]:
        """A TRL ``reward_funcs`` entry with these settings (TRL logs it by ``__name__``)."""

        def reward_func(prompts: Any, completions: Sequence[Any], answer: Sequence[str], **_: Any):
            for name, column in (("completions", completions), ("answer", answer)):
                if isinstance(column, str) or not isinstance(column, Sequence):
                    raise TypeError(f"{name} must be a list, got {type(column).__name__}")
            if len(completions) != len(answer):
                raise ValueError(
                    "completions and answer must have the same length, "
                    f"got {len(completions)} and {len(answer)}"
                )
            pairs = zip(completions, answer, strict=True)
            return [self(_completion_text(c), a).reward for c, a in pairs]

        reward_func.__name__ = reward_func.__qualname__ = f"gsm8k_{self.mode}_reward"
        return reward_func


def gsm8k_reward_func(
    prompts: Any, completions: Sequence[Any], answer: Sequence[str], **kwargs: Any
) -> list[float]:
    """GSM8K reward for TRL's ``GRPOTrainer(reward_funcs=[gsm8k_reward_func])``.

    TRL calls it as ``f(prompts=..., completions=..., completion_ids=..., trainer_state=...,
    **dataset_columns)``, so the dataset's ``answer`` column arrives by name and the rest is
    ignored. A completion is a string, or a list of messages whose last assistant
    ``content`` is scored. Default settings: tags mode, 1.0 / 0.1 / 0.0.

    >>> done = [{"role": "assistant", "content": "<answer>18</answer>"}]
    >>> gsm8k_reward_func(prompts=[[]], completions=[done], answer=["#### 18"], trainer_state=None)
    [1.0]
    """
    return _DEFAULT_FUNC(prompts, completions, answer, **kwargs)


def _completion_text(completion: Any) -> str:
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


def _check_str(name: str, value: Any) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}: {value!r:.80}")


def _check_mode(mode: Any) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(map(repr, MODES))}; got {mode!r}")


def _check_reward(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be an int or float, got {type(value).__name__}: {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")


_DEFAULT_FUNC = GSM8KReward().as_reward_func()
