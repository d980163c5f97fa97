"""IFEval (``LLMChat-IFEval-v0``): writing requests carrying IFEval's verifiable instructions
(word counts, keywords, all-lowercase, JSON, bullet points, ...), generated offline at a level
and graded per instruction by IFEval's own checkers (the ``ifeval`` extra).

The reward is a ``Rubric`` of one part, ``followed``: the share of the item's constraints
followed (strictly; loosely with ``loose=True``; 1.0 or 0.0 with ``all_or_nothing=True``). A
rubric's parts are the same for every item while the constraints, their kinds and count,
differ from item to item, so a constraint is not a part of its own: its ``strict`` and
``loose`` verdicts are in ``info["constraints"]``, beside the strict and loose fractions. The
checks run once a response, in that part (a part per fraction would run them again).
"""

from __future__ import annotations

import functools
import string
from collections.abc import Collection, Mapping
from typing import Any

import numpy as np

from llm_gym.checks import check_int
from llm_gym.rewards.ifeval import (
    MAX_RESPONSE_CHARS,
    IFEvalReward,
    describe_instruction,
    ifeval_library,
    instruction_conflicts,
)
from llm_gym.rubrics import Part, Rubric, TaskScore
from llm_gym.sources.procedural import ProceduralSource
from llm_gym.tasks.task import Task, reward_version

__all__ = [
    "IFEVAL_EASY",
    "IFEVAL_HARD",
    "IFEVAL_LEVELS",
    "IFEVAL_MEDIUM",
    "ifeval_prompt",
    "ifeval_task",
]

# IFEval's instruction ids by how hard they are to follow. Left out: IFEval's
# "detectable_format:constrained_response" ("Answer with one of: My answer is yes. ..."),
# which needs a yes/no question rather than a writing request (instruction_ids= takes it).
IFEVAL_EASY = (
    "punctuation:no_comma",
    "change_case:english_lowercase",
    "change_case:english_capital",
    "startend:end_checker",
    "startend:quotation",
    "detectable_content:postscript",
    "detectable_format:title",
    "keywords:existence",
)
IFEVAL_MEDIUM = (
    "keywords:frequency",
    "keywords:forbidden_words",
    "keywords:letter_frequency",
    "length_constraints:number_words",
    "length_constraints:number_sentences",
    "detectable_content:number_placeholders",
    "detectable_format:number_bullet_lists",
    "detectable_format:number_highlighted_sections",
    "detectable_format:json_format",
    "change_case:capital_word_frequency",
)
IFEVAL_HARD = (
    "length_constraints:number_paragraphs",
    "length_constraints:nth_paragraph_first_word",
    "detectable_format:multiple_sections",
    "combination:two_responses",
    "combination:repeat_prompt",
    "language:response_language",
)
# (how many constraints, the instruction ids they are drawn from) per level.
IFEVAL_LEVELS = (
    (1, IFEVAL_EASY),
    (1, IFEVAL_EASY + IFEVAL_MEDIUM),
    (2, IFEVAL_EASY + IFEVAL_MEDIUM),
    (2, IFEVAL_EASY + IFEVAL_MEDIUM + IFEVAL_HARD),
    (3, IFEVAL_EASY + IFEVAL_MEDIUM + IFEVAL_HARD),
    (4, IFEVAL_EASY + IFEVAL_MEDIUM + IFEVAL_HARD),
)
DEFAULT_LEVEL = 0

# The writing requests: a form and a topic. No commas, so that "repeat the request" and "no
# commas" can go together. Each topic has words a response about it would use: the forbidden
# words are drawn from them (random words would be no constraint at all).
_FORMS = (
    "Write a short story about {}.",
    "Write a poem about {}.",
    "Write a blog post about {}.",
    "Write a letter to a friend about {}.",
    "Write a short essay about {}.",
    "Write a speech about {}.",
    "Write a diary entry about {}.",
    "Explain {} to a child.",
)
_TOPICS = (
    ("honey bees", ("bees", "honey", "flowers")),
    ("the water cycle", ("rain", "clouds", "evaporation")),
    ("volcanoes", ("lava", "eruption", "magma")),
    ("the first landing on the moon", ("astronauts", "rocket", "moon")),
    ("learning to ride a bike", ("bike", "pedal", "balance")),
    ("why sleep matters", ("sleep", "rest", "night")),
    ("a visit to the zoo", ("animals", "lions", "zoo")),
    ("growing vegetables at home", ("garden", "soil", "seeds")),
    ("the history of tea", ("tea", "leaves", "cup")),
    ("ocean tides", ("ocean", "waves", "beach")),
    ("a summer camp", ("camp", "tent", "campfire")),
    ("recycling", ("plastic", "waste", "bins")),
    ("the northern lights", ("lights", "aurora", "colors")),
    ("a lost cat finding its way home", ("cat", "home", "lost")),
    ("traveling to Mars", ("mars", "planet", "spaceship")),
    ("the first day of school", ("school", "teacher", "classroom")),
    ("hiking in the mountains", ("mountain", "trail", "hike")),
    ("a small bakery", ("bread", "bakery", "oven")),
    ("electric cars", ("battery", "cars", "electric")),
    ("the rain forest", ("trees", "forest", "jungle")),
    ("the game of chess", ("chess", "king", "board")),
    ("a long train journey", ("train", "journey", "station")),
    ("life in the desert", ("desert", "sand", "heat")),
    ("how a rainbow forms", ("rainbow", "light", "sun")),
)
# Letters rare in English: "less than N times" of a common letter cannot be followed.
_RARE_LETTERS = "jkqvxz"
# Draws of a draw: enough that the built-in levels never run out (tested over many seeds).
_MAX_DRAWS = 200


def _integer(rng: np.random.Generator, low: int, high: int) -> int:
    """Python's ``random.randint(low, high)`` (both ends included), from ``rng``."""
    return int(rng.integers(low, high + 1))


def _choice(rng: np.random.Generator, options: Collection[Any]) -> Any:
    options = list(options)
    return options[int(rng.integers(len(options)))]


def _words(rng: np.random.Generator, words: Collection[str], count: int) -> list[str]:
    words = list(words)
    return [words[i] for i in rng.choice(len(words), size=count, replace=False)]


def _instruction_kwargs(
    instruction_id: str,
    rng: np.random.Generator,
    request: str,
    topic_words: tuple[str, ...],
    taken: set[str],
) -> dict[str, Any]:
    """The arguments of one instruction, in the ranges IFEval's ``build_description`` draws
    from (its module constants), from ``rng`` rather than Python's global ``random``. Words
    of IFEval's list are drawn from those not ``taken`` (the topic's words and the prompt's
    other keywords: "include honey" beside "do not include honey" cannot be followed)."""
    instructions, _, util = ifeval_library()
    relations = instructions._COMPARISON_RELATION  # ("less than", "at least")
    free = [word for word in util.WORD_LIST if word not in taken]
    if instruction_id == "keywords:existence":
        return {"keywords": _words(rng, free, instructions._NUM_KEYWORDS)}
    if instruction_id == "keywords:frequency":
        return {
            "keyword": _choice(rng, free),
            "frequency": _integer(rng, 1, instructions._KEYWORD_FREQUENCY),
            "relation": _choice(rng, relations),
        }
    if instruction_id == "keywords:forbidden_words":
        return {"forbidden_words": _words(rng, topic_words, instructions._NUM_KEYWORDS)}
    if instruction_id == "keywords:letter_frequency":
        relation = _choice(rng, relations)
        rare = relation == relations[0]
        return {
            "letter": _choice(rng, _RARE_LETTERS if rare else string.ascii_lowercase),
            # "less than 1" would forbid a letter the end phrase or a keyword may need.
            "let_frequency": _integer(rng, 2 if rare else 1, instructions._LETTER_FREQUENCY),
            "let_relation": relation,
        }
    if instruction_id == "language:response_language":
        languages = [code for code in util.LANGUAGE_CODES if code != "en"]  # en: no constraint
        return {"language": _choice(rng, languages)}
    if instruction_id == "length_constraints:number_sentences":
        relation = _choice(rng, relations)
        low = 2 if relation == relations[0] else 1  # "less than 1 sentence" cannot be followed
        return {
            "num_sentences": _integer(rng, low, instructions._MAX_NUM_SENTENCES),
            "relation": relation,
        }
    if instruction_id == "length_constraints:number_paragraphs":
        return {"num_paragraphs": _integer(rng, 1, instructions._NUM_PARAGRAPHS)}
    if instruction_id == "length_constraints:number_words":
        return {
            "num_words": _integer(
                rng, instructions._NUM_WORDS_LOWER_LIMIT, instructions._NUM_WORDS_UPPER_LIMIT
            ),
            "relation": _choice(rng, relations),
        }
    if instruction_id == "length_constraints:nth_paragraph_first_word":
        paragraphs = _integer(rng, 1, instructions._NUM_PARAGRAPHS)
        return {
            "num_paragraphs": paragraphs,
            # IFEval draws up to paragraphs + 1, a paragraph that cannot be there.
            "nth_paragraph": _integer(rng, 1, paragraphs),
            "first_word": _choice(rng, free),
        }
    if instruction_id == "detectable_content:number_placeholders":
        return {"num_placeholders": _integer(rng, 1, instructions._NUM_PLACEHOLDERS)}
    if instruction_id == "detectable_content:postscript":
        return {"postscript_marker": _choice(rng, instructions._POSTSCRIPT_MARKER)}
    if instruction_id == "detectable_format:number_bullet_lists":
        return {"num_bullets": _integer(rng, 1, instructions._NUM_BULLETS)}
    if instruction_id == "detectable_format:number_highlighted_sections":
        return {"num_highlights": _integer(rng, 1, instructions._NUM_HIGHLIGHTED_SECTIONS)}
    if instruction_id == "detectable_format:multiple_sections":
        return {
            "section_spliter": _choice(rng, instructions._SECTION_SPLITER),
            "num_sections": _integer(rng, 1, instructions._NUM_SECTIONS),
        }
    if instruction_id == "combination:repeat_prompt":
        return {"prompt_to_repeat": request}
    if instruction_id == "startend:end_checker":
        return {"end_phrase": _choice(rng, instructions._ENDING_OPTIONS)}
    if instruction_id == "change_case:capital_word_frequency":
        return {
            "capital_frequency": _integer(rng, 1, instructions._ALL_CAPITAL_WORD_FREQUENCY),
            "capital_relation": _choice(rng, relations),
        }
    return {}  # the instructions without arguments (JSON, title, no commas, ...)


def _draw_ids(rng: np.random.Generator, pool: tuple[str, ...], count: int) -> list[str] | None:
    """``count`` ids of ``pool`` no two of which conflict (``instruction_conflicts``), drawn
    one by one among those that fit; None when the draw ran out of ids that fit."""
    conflicts = instruction_conflicts()
    for _ in range(_MAX_DRAWS):
        chosen: list[str] = []
        while len(chosen) < count:
            fits = [i for i in pool if not any(i in conflicts[c] for c in chosen)]
            if not fits:
                break
            chosen.append(_choice(rng, fits))
        if len(chosen) == count:
            return chosen
    return None


@functools.cache
def _most_that_fit(pool: tuple[str, ...], up_to: int) -> int:
    """The most ids of ``pool``, at most ``up_to``, no two of which conflict."""
    conflicts = instruction_conflicts()

    def fits(chosen: list[str], rest: tuple[str, ...], count: int) -> bool:
        if len(chosen) == count:
            return True
        for i, candidate in enumerate(rest):
            if len(chosen) + len(rest) - i < count:
                return False
            if not any(candidate in conflicts[c] for c in chosen):
                if fits([*chosen, candidate], rest[i + 1 :], count):
                    return True
        return False

    return next((n for n in range(up_to, 0, -1) if fits([], pool, n)), 0)


def ifeval_prompt(
    seed: int,
    index: int,
    level: int,
    *,
    num_constraints: int | None = None,
    instruction_ids: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    """Prompt ``index`` of ``seed`` at ``level``: ``query`` (the request, then each
    constraint's instruction on a line of its own, as IFEval phrases it), ``request`` and
    ``constraints`` (IFEval instruction ids and their arguments, JSON-able).

    >>> a, b = ifeval_prompt(0, 3, 2), ifeval_prompt(0, 3, 2)
    >>> a == b, len(a["constraints"])
    (True, 2)
    """
    count, pool = IFEVAL_LEVELS[level]
    if instruction_ids is not None:  # the level's count, or as many of them as fit
        pool = tuple(instruction_ids)
        count = _most_that_fit(pool, count)
    count = count if num_constraints is None else num_constraints
    rng = np.random.default_rng([seed, index])
    form, (topic, topic_words) = _choice(rng, _FORMS), _choice(rng, _TOPICS)
    request = form.format(topic)
    ids = _draw_ids(rng, pool, count)
    if ids is None:
        raise ValueError(
            f"no {count} of the instruction ids {list(pool)} can go together (IFEval's "
            "conflicts): lower num_constraints or give more instruction_ids"
        )
    lines, constraints = [request], []
    taken = set(topic_words)
    for instruction_id in ids:
        kwargs = _instruction_kwargs(instruction_id, rng, request, topic_words, taken)
        taken.update(kwargs.get("keywords", ()))
        taken.update(kwargs[key] for key in ("keyword", "first_word") if key in kwargs)
        description, kwargs = describe_instruction(instruction_id, kwargs)
        lines.append(description)
        constraints.append({"id": instruction_id, "kwargs": kwargs})
    return {"query": "\n".join(lines), "request": request, "constraints": constraints}


def _score(reward: IFEvalReward, response: str, item: Mapping[str, Any]) -> TaskScore:
    score = reward(response, item["constraints"])
    return TaskScore(score.reward, score.info())


def ifeval_task(
    *,
    level: int = DEFAULT_LEVEL,
    num_constraints: int | None = None,
    instruction_ids: Collection[str] | None = None,
    all_or_nothing: bool = False,
    loose: bool = False,
    max_response_chars: int = MAX_RESPONSE_CHARS,
) -> Task:
    """IFEval: a writing request with verifiable instructions, each graded by IFEval's checker.

    ## Description

    Each episode asks for a piece of writing ("Write a poem about honey bees.") followed by
    one to four of IFEval's verifiable instructions, one a line, in IFEval's own words and
    with arguments drawn in IFEval's ranges: no commas, all lowercase or all capitals, an end
    phrase, quotation marks, a postscript, a ``<<title>>``, keywords to include or avoid,
    letter and word frequencies, word, sentence and paragraph counts, placeholders, bullet
    points, highlighted and numbered sections, JSON, two responses, repeating the request, a
    language. Two instructions that IFEval marks as conflicting are never asked together.
    Prompts are generated offline from the seed (``llm_gym.tasks.ifeval_prompt``).

    ## Rewards

    Each constraint is graded by IFEval's own checker (``if-verifiable``'s copy of Google's
    code, ``llm_gym.rewards.IFEvalReward``), strictly (the response as it is) and loosely
    (IFEval's loose reading: also with the first and/or last line removed, with and without
    ``*``). The reward is the fraction of constraints followed strictly (IFEval's
    instruction-level accuracy): partial credit separates the responses of a group that all
    miss something, where an all-or-nothing reward at two or more constraints would be 0.0
    for most of them and teach nothing. ``all_or_nothing=True`` pays 1.0 only when all are
    followed; ``loose=True`` pays on the loose verdicts (which forgive a "Sure, here it is:"
    line, so do not teach leaving it out). The reward is a ``Rubric`` of one part,
    ``followed`` (the reward above). ``info``: ``followed``, ``constraints`` (each ``id``,
    ``kwargs``, ``strict`` and ``loose``), ``strict`` and ``loose`` (all followed: IFEval's
    prompt-level accuracy), ``strict_fraction``, ``loose_fraction``, ``too_long``, ``reward``
    and ``success`` (= ``strict``). The reset ``info`` holds ``request`` and ``constraints``
    (ids and kwargs).

    ## Starting State

    The user's message: the request, then one instruction a line. No system prompt (IFEval
    has none).

    ## Episode End

    One turn: the episode ends (``terminated``) after the response. A response of any shape
    is graded and never raises: over ``max_response_chars`` characters it fails every
    constraint unread, and checks are bounded in time.

    ## Arguments

    - ``level``: 0 to 5 (``IFEVAL_LEVELS``): how many constraints and of which kinds; 0 (the
      default) is one easy constraint (``IFEVAL_EASY``: no commas, lowercase, capitals, end
      phrase, quotation, postscript, title, keywords), 1 one of the easy and medium ones
      (``IFEVAL_MEDIUM``: frequencies, word and sentence counts, placeholders, bullets,
      highlights, JSON, forbidden words), 2 two of those, 3 two of all kinds
      (``IFEVAL_HARD``: paragraphs, sections, two responses, repeat the request, language),
      4 three and 5 four. The env's ``set_level`` changes it.
    - ``num_constraints``: how many constraints, whatever the level (at most as many as can
      go together: 6 of the easy ones). ``instruction_ids``: the IFEval instruction ids they
      are drawn from, whatever the level (then the level's count, or as many of them as can go
      together).
    - ``all_or_nothing``, ``loose``: the reward (above).
    - ``max_response_chars``: longer responses fail every constraint unread (8000).

    ## Version History

    - v0: Initial version.

    ## Example

    >>> import gymnasium as gym, llm_gym
    >>> env = gym.make("LLMChat-IFEval-v0", instruction_ids=["punctuation:no_comma"], seed=0)
    >>> obs, info = env.reset(seed=0)
    >>> obs["history"][-1]["content"].splitlines()[-1]
    'In your entire response, refrain from the use of any commas.'
    >>> info["constraints"]
    [{'id': 'punctuation:no_comma', 'kwargs': {}}]
    >>> obs, reward, terminated, truncated, info = env.step("Bees dance and hum all day.")
    >>> reward, terminated, info["strict"], info["constraints"][0]["strict"]
    (1.0, True, True, True)
    """
    _, registry, _ = ifeval_library()
    num_levels = len(IFEVAL_LEVELS)
    check_int("level", level, 0, num_levels - 1)
    check_int("num_constraints", num_constraints, 1, optional=True)
    ids = None
    if instruction_ids is not None:
        if isinstance(instruction_ids, str) or not isinstance(instruction_ids, Collection):
            raise ValueError(
                "instruction_ids must be a list of IFEval instruction ids, got "
                f"{instruction_ids!r:.120}"
            )
        ids = tuple(dict.fromkeys(instruction_ids))
        unknown = [i for i in ids if i not in registry.INSTRUCTION_DICT]
        if unknown or not ids:
            raise ValueError(
                f"instruction_ids must be IFEval instruction ids, some of "
                f"{sorted(registry.INSTRUCTION_DICT)}; got {list(instruction_ids)!r:.300}"
            )
    reward = IFEvalReward(all_or_nothing, loose, max_response_chars)
    generate = functools.partial(
        ifeval_prompt, num_constraints=num_constraints, instruction_ids=ids
    )
    if num_constraints is not None:  # a count the ids cannot reach fails here, not at reset
        pools = {pool for _, pool in IFEVAL_LEVELS} if ids is None else {ids}
        for pool in pools:
            most = _most_that_fit(pool, num_constraints)
            if most < num_constraints:
                raise ValueError(
                    f"num_constraints must be at most {most}: no more of the instruction ids "
                    f"{list(pool)} can go together (IFEval's conflicts); got {num_constraints}"
                )
    return Task(
        source=ProceduralSource(generate, num_levels=num_levels, level=level),
        prompt=None,
        reward=Rubric([Part("followed", functools.partial(_score, reward))]),
        answer_format=None,
        required_fields=("constraints",),
        reward_version=reward_version("1"),
    )
