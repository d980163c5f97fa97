"""LLMChat-IFEval-v0 (issue 41, item 3): procedural prompts with IFEval's verifiable
instructions, graded per instruction by IFEval's own checkers (if-verifiable's copy of
Google's code), strict and loose, offline, deterministic and in bounded time."""

import functools
import json
import subprocess
import sys

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env
from gymnasium.vector import AutoresetMode

import llm_gym
from llm_gym.envs import make_task_env, sharded_env_fns
from llm_gym.rewards.ifeval import (
    _MAX_REGEX_STEPS,  # the quadratic checkers' bound, and their costs
    _QUADRATIC,
    EXTRA_CONFLICTS,
    MAX_RESPONSE_CHARS,
    IFEvalReward,
    describe_instruction,
    english_letters,
    has_visible_character,
    ifeval_library,
    ifeval_reward_func,
    instruction_conflicts,
)
from llm_gym.tasks.ifeval import (
    IFEVAL_EASY,
    IFEVAL_HARD,
    IFEVAL_LEVELS,
    IFEVAL_MEDIUM,
    ifeval_prompt,
    ifeval_task,
)

pytest.importorskip("if_verifiable")
import langdetect  # noqa: E402
from if_verifiable.common import get_loose_transformations  # noqa: E402
from if_verifiable.ifeval import instructions_registry as registry  # noqa: E402
from if_verifiable.ifeval import instructions_util  # noqa: E402

ENV_ID = "LLMChat-IFEval-v0"
ifeval_library()  # NLTK's Punkt data in place before the checkers are called directly
make_ifeval_env = functools.partial(make_task_env, ifeval_task)


@pytest.fixture(scope="module", autouse=True)
def registered():
    """The id, registered for these tests if ``import llm_gym`` did not, and only for them."""
    missing = ENV_ID not in gym.registry
    llm_gym.register_task(ENV_ID, "llm_gym.tasks.ifeval:ifeval_task")
    yield
    if missing:
        del gym.registry[ENV_ID]


# (instruction id, kwargs, a response that follows it, one that does not): every id the
# levels draw, and constrained_response (instruction_ids= only).
CASES = [
    ("punctuation:no_comma", {}, "Bees hum all day long.", "Bees hum, all day long."),
    (
        "change_case:english_lowercase",
        {},
        "bees make honey in the summer and they rest in the winter.",
        "Bees make honey in the summer and they rest in the winter.",
    ),
    (
        "change_case:english_capital",
        {},
        "BEES MAKE HONEY IN THE SUMMER AND THEY REST IN THE WINTER.",
        "Bees make honey in the summer and they rest in the winter.",
    ),
    (
        "startend:end_checker",
        {"end_phrase": "Any other questions?"},
        "Bees make honey. Any other questions?",
        "Any other questions? Bees make honey.",
    ),
    ("startend:quotation", {}, '"Bees make honey."', "Bees make honey."),
    (
        "detectable_content:postscript",
        {"postscript_marker": "P.S."},
        "Bees make honey.\nP.S. I love bees.",
        "Bees make honey. I love bees.",
    ),
    (
        "detectable_content:postscript",
        {"postscript_marker": "P.P.S"},
        "Bees make honey.\nP.P.S. I love bees.",
        "Bees make honey.\nP.S. I love bees.",
    ),
    ("detectable_format:title", {}, "<<Busy Bees>>\nBees hum.", "Busy Bees\nBees hum."),
    (
        "keywords:existence",
        {"keywords": ["agency", "potato"]},
        "The agency grew a potato.",
        "The agency grew a carrot.",
    ),
    (
        "keywords:frequency",
        {"keyword": "potato", "frequency": 2, "relation": "at least"},
        "A potato and another potato.",
        "A potato and a carrot.",
    ),
    (
        "keywords:frequency",
        {"keyword": "potato", "frequency": 2, "relation": "less than"},
        "A potato and a carrot.",
        "A potato and another potato.",
    ),
    (
        "keywords:forbidden_words",
        {"forbidden_words": ["honey", "bees"]},
        "Insects make a sweet syrup.",
        "Bees make honey.",
    ),
    (
        "keywords:letter_frequency",
        {"letter": "z", "let_frequency": 2, "let_relation": "less than"},
        "Bees hum.",
        "Bees buzz.",
    ),
    (
        "keywords:letter_frequency",
        {"letter": "e", "let_frequency": 3, "let_relation": "at least"},
        "Bees see.",
        "Ants hum.",
    ),
    (
        "length_constraints:number_words",
        {"num_words": 5, "relation": "less than"},
        "Bees hum.",
        "Bees hum all day long in the sun.",
    ),
    (
        "length_constraints:number_words",
        {"num_words": 5, "relation": "at least"},
        "Bees hum all day long in the sun.",
        "Bees hum.",
    ),
    # NLTK's English Punkt model: "Dr." is an abbreviation, not the end of a sentence.
    (
        "length_constraints:number_sentences",
        {"num_sentences": 2, "relation": "at least"},
        "Dr. Smith keeps bees. He sells honey.",
        "Dr. Smith keeps bees and sells honey.",
    ),
    (
        "length_constraints:number_sentences",
        {"num_sentences": 2, "relation": "less than"},
        "Dr. Smith keeps bees.",
        "Dr. Smith keeps bees. He sells honey.",
    ),
    (
        "detectable_content:number_placeholders",
        {"num_placeholders": 2},
        "Dear [name], see you at [address].",
        "Dear [name], see you soon.",
    ),
    (
        "detectable_format:number_bullet_lists",
        {"num_bullets": 2},
        "Bees:\n* make honey\n* dance",
        "Bees:\n* make honey\n* dance\n* sting",
    ),
    (
        "detectable_format:number_highlighted_sections",
        {"num_highlights": 2},
        "Bees *make honey* and *dance*.",
        "Bees *make honey* and dance.",
    ),
    ("detectable_format:json_format", {}, '```json\n{"bees": 3}\n```', "bees: 3"),
    (
        "change_case:capital_word_frequency",
        {"capital_frequency": 2, "capital_relation": "at least"},
        "BEES make HONEY.",
        "Bees make HONEY.",
    ),
    (
        "length_constraints:number_paragraphs",
        {"num_paragraphs": 2},
        "Bees hum.\n***\nHoney is sweet.",
        "Bees hum. Honey is sweet.",
    ),
    (
        "length_constraints:nth_paragraph_first_word",
        {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "potato"},
        "Bees hum.\n\nPotato fields are quiet.",
        "Bees hum.\n\nHoney fields are quiet.",
    ),
    (
        "detectable_format:multiple_sections",
        {"section_spliter": "SECTION", "num_sections": 2},
        "SECTION 1\nBees hum.\nSECTION 2\nHoney is sweet.",
        "SECTION 1\nBees hum. Honey is sweet.",
    ),
    (
        "combination:two_responses",
        {},
        "Bees make honey.\n******\nHoney comes from bees.",
        "Bees make honey.",
    ),
    (
        "combination:repeat_prompt",
        {"prompt_to_repeat": "Write a poem about honey bees."},
        "Write a poem about honey bees. Bees hum in the sun.",
        "Bees hum in the sun.",
    ),
    (
        "language:response_language",
        {"language": "fr"},
        "Les abeilles fabriquent du miel dans la ruche pendant tout l'été.",
        "Bees make honey in the hive all summer long and rest in the winter.",
    ),
    ("detectable_format:constrained_response", {}, "My answer is yes.", "Yes."),
]
IDS = sorted({case[0] for case in CASES})

HOSTILE = [
    "",
    " ",
    "\x00" * 3000,
    bytes(range(256)).decode("latin-1") * 30,
    "\ud800 lone surrogate \udfff",
    "[" * (MAX_RESPONSE_CHARS - 1),
    "<<" * (MAX_RESPONSE_CHARS // 2 - 1),
    " " * (MAX_RESPONSE_CHARS - 1),
    "\n" * (MAX_RESPONSE_CHARS - 1),
    " \n" * (MAX_RESPONSE_CHARS // 2 - 1),
    "a. " * (MAX_RESPONSE_CHARS // 3),
    "*" * (MAX_RESPONSE_CHARS - 1),
    "[" * 3999 + "]" * 3999,  # valid JSON, nested past the decoder's recursion limit
    '{"a": ' * 1000 + "1" + "}" * 1000,
    "1" * 5000,  # a JSON number past Python's 4300 digits
    "SECTION 1 " * 790,
    "P.S." * 1990,
    "Dr. " * 1990,
    "a" * 1_000_000,  # a megabyte: over max_chars, not read
]


def all_constraints():
    return [{"id": name, "kwargs": kwargs} for name, kwargs, _, _ in CASES]


# The checks that pass a text whose language langdetect cannot find (issue 53: not here).
LANGUAGE_IDS = {
    "language:response_language",
    "change_case:english_capital",
    "change_case:english_lowercase",
}


def library_verdicts(response, instruction_id, kwargs):
    """IFEval's checker called directly, strict and loose as Google's evaluation defines,
    with llm_gym's two departures (issue 53): a text with no visible character follows
    nothing, and one whose language cannot be found fails the language checks."""

    def check(text):
        checker = registry.INSTRUCTION_DICT[instruction_id](instruction_id)
        checker.build_description(**kwargs)
        followed = bool(text.strip() and checker.check_following(text))
        if followed and instruction_id in LANGUAGE_IDS:  # (langdetect is slow: only then)
            try:
                langdetect.detect(text)
            except langdetect.LangDetectException:
                followed = False
        return followed and has_visible_character(text)

    strict = check(response)
    loose = any(check(variant) for variant in get_loose_transformations(response))
    return strict, loose


# -- prompts: deterministic, levels, conflicts ----------------------------------------------


def test_prompts_are_deterministic_per_seed_in_any_process():
    here = [ifeval_prompt(11, i, level) for i in range(5) for level in range(6)]
    assert here == [ifeval_prompt(11, i, level) for i in range(5) for level in range(6)]
    code = (
        "import json; from llm_gym.tasks.ifeval import ifeval_prompt; "
        "print(json.dumps([ifeval_prompt(11, i, l) for i in range(5) for l in range(6)]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert json.loads(out) == here  # JSON-able, and the same in a fresh process
    assert ifeval_prompt(12, 0, 3) != ifeval_prompt(11, 0, 3)
    assert len({ifeval_prompt(11, i, 2)["query"] for i in range(50)}) == 50


@pytest.mark.parametrize("level", range(len(IFEVAL_LEVELS)))
def test_each_level_draws_its_count_of_its_kinds(level):
    count, pool = IFEVAL_LEVELS[level]
    seen = set()
    for index in range(300):
        sample = ifeval_prompt(3, index, level)
        ids = [c["id"] for c in sample["constraints"]]
        assert len(ids) == count and set(ids) <= set(pool)
        seen |= set(ids)
        lines = sample["query"].split("\n")
        assert lines[0] == sample["request"] and "," not in sample["request"]
        for c in sample["constraints"]:  # each instruction in IFEval's words, in order
            assert describe_instruction(c["id"], c["kwargs"])[0] in sample["query"]
    # JSON goes with two other kinds at most, so never among four.
    expected = set(pool) - ({"detectable_format:json_format"} if count >= 4 else set())
    assert seen == expected
    assert IFEVAL_LEVELS[0] == (1, IFEVAL_EASY)
    assert set(IFEVAL_EASY) | set(IFEVAL_MEDIUM) | set(IFEVAL_HARD) == set(
        registry.INSTRUCTION_DICT
    ) - {"detectable_format:constrained_response"}


def test_no_prompt_holds_a_pair_that_ifeval_marks_as_conflicting():
    raw = registry.INSTRUCTION_CONFLICTS  # IFEval's map, either direction
    extra = {frozenset(pair) for pair in EXTRA_CONFLICTS}
    checked = 0
    for seed in range(4):
        for level in range(2, len(IFEVAL_LEVELS)):
            for index in range(250):
                ids = [c["id"] for c in ifeval_prompt(seed, index, level)["constraints"]]
                assert len(set(ids)) == len(ids)
                for i, a in enumerate(ids):
                    for b in ids[i + 1 :]:
                        assert b not in raw[a] and a not in raw[b], (a, b)
                        assert frozenset((a, b)) not in extra
                        checked += 1
    assert checked > 5000
    conflicts = instruction_conflicts()  # symmetric
    assert all(a in conflicts[b] for a in conflicts for b in conflicts[a])


def test_words_of_a_prompt_never_contradict_each_other():
    for index in range(400):
        words = set()
        sample = ifeval_prompt(5, index, 5, num_constraints=5)
        forbidden = set()
        for c in sample["constraints"]:
            kwargs = c["kwargs"]
            forbidden |= set(kwargs.get("forbidden_words", ()))
            new = [*kwargs.get("keywords", ()), kwargs.get("keyword"), kwargs.get("first_word")]
            new = [w for w in new if w]
            assert not words & set(new)
            words |= set(new)
        assert not words & forbidden


# -- verdicts: per kind, strict and loose, the library's own ---------------------------------


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_each_kind_passes_and_fails_the_expected_responses(case):
    instruction_id, kwargs, passing, failing = case
    reward = IFEvalReward()
    constraints = [{"id": instruction_id, "kwargs": kwargs}]
    good, bad = reward(passing, constraints), reward(failing, constraints)
    assert (good.strict, good.reward, good.all_strict) == ((True,), 1.0, True)
    assert (bad.strict, bad.reward, bad.all_strict) == ((False,), 0.0, False)
    assert good.loose == (True,)
    # What IFEval's checker says itself.
    assert library_verdicts(passing, instruction_id, kwargs)[0] is True
    assert library_verdicts(failing, instruction_id, kwargs)[0] is False


def test_loose_forgives_a_preamble_line_and_markdown_asterisks():
    reward = IFEvalReward()
    constraints = [
        {"id": "punctuation:no_comma", "kwargs": {}},
        {"id": "change_case:english_lowercase", "kwargs": {}},
        {"id": "startend:quotation", "kwargs": {}},
    ]
    response = 'Sure, here it is:\n"bees make honey in the summer and they rest in the winter."'
    score = reward(response, constraints)
    assert score.strict == (False, False, False) and score.loose == (True, True, True)
    assert (score.all_strict, score.all_loose, score.reward) == (False, True, 0.0)
    assert IFEvalReward(loose=True)(response, constraints).reward == 1.0
    # Markdown asterisks around the end phrase: strict reads "**" at the end, loose drops them.
    end = [
        {
            "id": "startend:end_checker",
            "kwargs": {"end_phrase": "Is there anything else I can help with?"},
        }
    ]
    score = reward("Bees hum. **Is there anything else I can help with?**", end)
    assert (score.strict, score.loose) == ((False,), (True,))


def test_reward_is_the_fraction_followed_or_all_or_nothing():
    constraints = [c for c in all_constraints() if c["id"] in IFEVAL_EASY][:4]
    response = "Bees make honey, they dance."
    score = IFEvalReward()(response, constraints)
    assert score.reward == sum(score.strict) / 4 == score.strict_fraction
    follows_two = [
        {"id": "keywords:existence", "kwargs": {"keywords": ["agency", "potato"]}},
        {"id": "punctuation:no_comma", "kwargs": {}},
        {"id": "startend:quotation", "kwargs": {}},
    ]
    text = "The agency grew a potato."
    assert IFEvalReward()(text, follows_two).reward == pytest.approx(2 / 3)
    assert IFEvalReward(all_or_nothing=True)(text, follows_two).reward == 0.0
    assert IFEvalReward(all_or_nothing=True)(f'"{text}"', follows_two).reward == 1.0


@pytest.mark.slow
def test_the_reward_is_what_ifeval_s_checkers_say_on_the_same_response():
    """Differential: every instruction kind, and those of generated prompts, on many responses
    (every case's, and a fixed third of them with a preamble line or markdown added), graded
    here and by the library directly."""
    cases = {r for case in CASES for r in case[2:]}
    dressed = {f"Sure, here it is:\n{r}" for r in cases}
    dressed |= {f"**{r}**\nHope this helps!" for r in sorted(cases | dressed)[::6]}
    responses = sorted(cases) + sorted(dressed)[::3]
    constraints = all_constraints()
    assert {c["id"] for c in constraints} == set(registry.INSTRUCTION_DICT)  # every kind
    for index in range(4):
        constraints += ifeval_prompt(9, index, 4)["constraints"]
    reward = IFEvalReward()
    compared = 0
    for response in responses:
        score = reward(response, constraints)
        for c, strict, loose in zip(constraints, score.strict, score.loose, strict=True):
            expected = library_verdicts(response, c["id"], c["kwargs"])
            assert (strict, loose) == expected, (c, response)
            compared += 1
        assert score.reward == sum(score.strict) / len(constraints)
    assert compared > 3_000


# -- hostile output -------------------------------------------------------------------------


@pytest.fixture
def reads(monkeypatch):
    """Every text IFEval's own checkers are given, as (instruction id, text): what bounds the
    time a response costs is what reaches them (the regexes' work grows with it)."""
    seen = []
    for checker_class in set(registry.INSTRUCTION_DICT.values()):
        original = checker_class.check_following

        def recording(self, value, _original=original, _class=checker_class):
            if type(self) is _class:  # a subclass's call is recorded once, by its own
                seen.append((self.id, value))
            return _original(self, value)

        monkeypatch.setattr(checker_class, "check_following", recording)
    return seen


def regex_steps(instruction_id, text):
    """The backtracking steps a quadratic checker's regex takes on ``text`` (0 for others)."""
    cost = _QUADRATIC.get(instruction_id)
    return 0 if cost is None else cost(text)


@pytest.mark.parametrize("response", HOSTILE, ids=[f"hostile{i}" for i in range(len(HOSTILE))])
def test_hostile_responses_score_in_bounded_time(response, reads):
    # Bounded by what the checkers are given, not by a clock: no text past max_chars, and no
    # quadratic regex past its step bound (~20 ms of re's time), reaches IFEval's checkers.
    constraints = all_constraints()
    score = IFEvalReward()(response, constraints)
    assert all(len(text) <= MAX_RESPONSE_CHARS for _, text in reads)
    assert max((regex_steps(i, t) for i, t in reads), default=0) <= _MAX_REGEX_STEPS
    assert len(score.strict) == len(score.loose) == len(constraints)
    assert 0.0 <= score.reward <= 1.0
    assert score.too_long == (len(response) > MAX_RESPONSE_CHARS)
    if score.too_long:
        assert not any(score.strict) and not any(score.loose) and score.reward == 0.0
    json.dumps(score.info())
    if score.too_long:
        assert reads == []  # refused unread


def test_quadratic_shapes_are_refused_and_deep_json_does_not_raise(reads):
    reward = IFEvalReward()
    # ~4 s per variant with IFEval's regex alone (49 million steps); refused unread here.
    spaces = [{"id": "detectable_content:postscript", "kwargs": {"postscript_marker": "P.S."}}]
    wide = "Bees." + " " * 7000 + "\nP.S. hi"
    assert regex_steps("detectable_content:postscript", wide) > 20 * _MAX_REGEX_STEPS
    assert reward(wide, spaces).strict == (False,)
    assert wide not in [text for _, text in reads]  # not read; a short loose variant may be
    assert all(regex_steps(i, text) <= _MAX_REGEX_STEPS for i, text in reads)
    reads.clear()
    assert reward("Bees.\nP.S. hi", spaces).strict == (True,)
    assert reads[0] == ("detectable_content:postscript", "Bees.\nP.S. hi")
    deep = [{"id": "detectable_format:json_format", "kwargs": {}}]
    assert reward("[" * 3000 + "]" * 3000, deep).strict == (False,)
    assert reward("[[1], {}]", deep).strict == (True,)
    assert IFEvalReward(max_chars=10)("Bees hum all day.", spaces).too_long


# -- the env ---------------------------------------------------------------------------------


def test_env_reset_and_step_info():
    env = gym.make(ENV_ID, level=3, seed=4)
    obs, info = env.reset(seed=4)
    history = obs["history"]
    assert [m["role"] for m in history] == ["user"]  # no system prompt, as IFEval
    assert history[0]["content"].split("\n")[0] == info["request"]
    assert len(info["constraints"]) == 2 and all(
        set(c) == {"id", "kwargs"} for c in info["constraints"]
    )
    json.dumps(info["constraints"])
    obs, reward, terminated, truncated, step = env.step("Bees hum.")
    assert (terminated, truncated) == (True, False) and isinstance(reward, float)
    assert [c["id"] for c in step["constraints"]] == [c["id"] for c in info["constraints"]]
    assert all(set(c) == {"id", "kwargs", "strict", "loose"} for c in step["constraints"])
    assert reward == step["reward"] == step["strict_fraction"]
    assert step["success"] == step["strict"] == all(c["strict"] for c in step["constraints"])
    assert step["loose"] == all(c["loose"] for c in step["constraints"])
    step["constraints"][0]["kwargs"]["x"] = 1  # a fresh copy: the sample is untouched
    assert "x" not in env.unwrapped.item["constraints"][0]["kwargs"]


def test_env_pays_the_fraction_followed_and_its_options():
    sample = {
        "query": "Write a poem about honey bees.",
        "constraints": [
            {"id": "punctuation:no_comma", "kwargs": {}},
            {"id": "startend:quotation", "kwargs": {}},
        ],
    }
    for kwargs, response, expected in [
        ({}, "Bees hum.", 0.5),
        ({"all_or_nothing": True}, "Bees hum.", 0.0),
        ({"all_or_nothing": True}, '"Bees hum."', 1.0),
        ({}, 'Sure, here:\n"Bees hum."', 0.0),
        ({"loose": True}, 'Sure, here:\n"Bees hum."', 1.0),
        ({"max_response_chars": 5}, '"Bees hum."', 0.0),
    ]:
        env = make_ifeval_env(seed=0, **kwargs)
        env.reset(options={"item": sample})
        _, reward, *_ = env.step(response)
        assert reward == expected, (kwargs, response)


@pytest.mark.parametrize("mode", ["history", "text", "tokens"])
def test_check_env_in_every_input_mode(mode, gpt2_tokenizer):
    tokenizer = None if mode == "history" else gpt2_tokenizer
    env = gym.make(ENV_ID, input_mode=mode, tokenizer=tokenizer, level=2, seed=0)
    check_env(env.unwrapped, skip_render_check=True)
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs) and list(obs) == [mode]


def test_levels_move_with_set_level_and_vector_envs_agree():
    env = make_ifeval_env(seed=1)
    assert (env.level, env.num_levels) == (0, len(IFEVAL_LEVELS))
    assert len(env.reset(seed=1)[1]["constraints"]) == 1
    env.set_level(5)
    assert len(env.reset()[1]["constraints"]) == 4

    def queries(mode):
        if mode == "native":
            envs = gym.make_vec(ENV_ID, num_envs=3, seed=5, level=2)
        else:
            fns = sharded_env_fns(ENV_ID, 3, seed=5, level=2)
            kw = {"shared_memory": False} if mode == "async" else {}
            vector = gym.vector.AsyncVectorEnv if mode == "async" else gym.vector.SyncVectorEnv
            envs = vector(fns, autoreset_mode=AutoresetMode.SAME_STEP, **kw)
        obs, _ = envs.reset(seed=5)
        seen = [h[-1]["content"] for h in obs["history"]]
        _, rewards, terminated, *_ = envs.step(["Bees hum."] * 3)
        envs.close()
        assert all(terminated) and all(0.0 <= r <= 1.0 for r in rewards)
        return seen

    native = queries("native")
    assert queries("sync") == native == queries("async") and len(set(native)) == 3


def test_instruction_ids_and_num_constraints():
    env = make_ifeval_env(instruction_ids=["detectable_format:title"], level=4, seed=0)
    _, info = env.reset(seed=0)  # level 4 asks three; one id gives one
    assert info["constraints"] == [{"id": "detectable_format:title", "kwargs": {}}]
    ids = ["detectable_format:json_format", "keywords:existence", "punctuation:no_comma"]
    env = make_ifeval_env(instruction_ids=ids, level=4, seed=0)
    for _ in range(20):  # JSON and no commas conflict: two of these at most
        got = {c["id"] for c in env.reset()[1]["constraints"]}
        assert len(got) == 2 and got != {ids[0], ids[2]}
    env = make_ifeval_env(num_constraints=6, seed=0)
    assert len(env.reset(seed=0)[1]["constraints"]) == 6
    constrained = make_ifeval_env(instruction_ids=["detectable_format:constrained_response"])
    assert "My answer is yes." in constrained.reset(seed=0)[0]["history"][-1]["content"]


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="level"):
        ifeval_task(level=6)
    with pytest.raises(ValueError, match="instruction_ids"):
        ifeval_task(instruction_ids=["no_such:instruction"])
    with pytest.raises(ValueError, match="instruction_ids"):
        ifeval_task(instruction_ids="punctuation:no_comma")
    with pytest.raises(ValueError, match="num_constraints must be at most 6"):
        ifeval_task(num_constraints=7)
    with pytest.raises(ValueError, match="num_constraints must be at most 1"):
        ifeval_task(num_constraints=2, instruction_ids=["detectable_format:json_format"])
    with pytest.raises(ValueError, match="all_or_nothing"):
        ifeval_task(all_or_nothing="yes")
    with pytest.raises(ValueError, match="max_chars"):
        IFEvalReward(max_chars=0)
    reward = IFEvalReward()
    with pytest.raises(ValueError, match=r"constraints\[0\]"):
        reward("x", [{"id": "nope"}])
    with pytest.raises(ValueError, match=r"constraints\[1\]"):
        reward("x", [{"id": "punctuation:no_comma"}, "punctuation:no_comma"])
    with pytest.raises(TypeError, match="constraints"):
        reward("x", {"id": "punctuation:no_comma"})
    with pytest.raises(ValueError, match=r"constraints\[0\]\['kwargs'\].*relation"):
        reward("x", [{"id": "keywords:frequency", "kwargs": {"keyword": "a", "relation": "most"}}])
    with pytest.raises(ValueError, match=r"constraints\[0\]\['kwargs'\]"):
        reward("x", [{"id": "punctuation:no_comma", "kwargs": {"colour": "red"}}])
    with pytest.raises(TypeError, match="response"):
        reward(b"x", [])


# -- the library's pieces --------------------------------------------------------------------


def test_descriptions_are_ifeval_s_and_sentences_use_nltk_s_english_punkt():
    for name, kwargs, _, _ in CASES:
        checker = registry.INSTRUCTION_DICT[name](name)
        text = checker.build_description(**kwargs)
        assert describe_instruction(name, kwargs) == (text, checker.get_instruction_args() or {})
    # Punkt's English model knows "Dr." and "p.m."; an untrained Punkt splits after both.
    assert instructions_util.count_sentences("Dr. Smith came at 3 p.m. today. He left.") == 2
    assert ifeval_library()[2] is instructions_util


def test_trl_reward_function():
    rows = [[{"id": "punctuation:no_comma", "kwargs": {}}]] * 2
    assert ifeval_reward_func(None, ["no commas", "a, b"], rows) == [1.0, 0.0]
    assert ifeval_reward_func(None, [[{"role": "assistant", "content": "ok"}]], rows[:1]) == [1.0]


# -- issue 53, finding 12: rewards that pay for nothing ---------------------------------------

# Text that shows nothing: zero-width spaces, NULs, a BOM and joiners, Hangul fillers,
# bidirectional marks with newlines (paragraphs "***"-free but empty).
INVISIBLE = ["\u200b" * 100, "\x00" * 10, "\ufeff\u200d\u2060" * 5, "\u3164 " * 20,
             "\u200e\n\n\u200f\n\n\u200b"]  # fmt: skip


@pytest.mark.parametrize("text", INVISIBLE, ids=[f"invisible{i}" for i in range(len(INVISIBLE))])
def test_a_response_with_no_visible_character_follows_no_instruction(text):
    assert not has_visible_character(text)
    constraints = all_constraints()
    score = IFEvalReward()(text, constraints)
    assert (score.strict, score.loose) == ((False,) * len(constraints),) * 2
    assert score.reward == 0.0
    # The finding's cases: full marks at level 4 on these three, a mean over 0 at every level.
    three = [{"id": "length_constraints:number_paragraphs", "kwargs": {"num_paragraphs": 1}},
             {"id": "language:response_language", "kwargs": {"language": "ja"}},
             {"id": "punctuation:no_comma", "kwargs": {}}]  # fmt: skip
    assert IFEvalReward(loose=True)(text, three).reward == 0.0
    for level in range(len(IFEVAL_LEVELS)):
        prompts = [ifeval_prompt(0, index, level) for index in range(20)]
        assert [IFEvalReward()(text, p["constraints"]).reward for p in prompts] == [0.0] * 20


def test_undetectable_text_fails_the_language_checks():
    for language in ("en", "ja", "fr"):
        rule = [{"id": "language:response_language", "kwargs": {"language": language}}]
        assert IFEvalReward()("12345 !!! 678", rule).strict == (False,)
    assert IFEvalReward()("Les abeilles font du miel tout l'été.", rule).strict == (True,)
    for rule in ("change_case:english_capital", "change_case:english_lowercase"):
        assert IFEvalReward()("1234 5678 ... 42", [{"id": rule}]).strict == (False,)
    # A loose variant that is only "***" no longer passes (IFEval passed it as undetectable).
    french = [{"id": "language:response_language", "kwargs": {"language": "fr"}}]
    assert IFEvalReward()("Bees hum.\n***\nHoney is sweet.", french).loose == (False,)


LOOK_ALIKES = {
    "fullwidth": "ＢＥＥＳ ＭＡＫＥ ＨＯＮＥＹ ＩＮ ＴＨＥ ＳＵＭＭＥＲ ＡＮＤ ＲＥＳＴ.",
    "mathematical": "𝐁𝐄𝐄𝐒 𝐌𝐀𝐊𝐄 𝐇𝐎𝐍𝐄𝐘 𝐈𝐍 𝐓𝐇𝐄 𝐒𝐔𝐌𝐌𝐄𝐑 𝐀𝐍𝐃 𝐑𝐄𝐒𝐓 𝐈𝐍 𝐖𝐈𝐍𝐓𝐄𝐑.",
    "cyrillic": "BEES MAKE HONEY IN THE SUMMER AND REST IN WINTER.".replace("E", "\u0415"),
    "circled": "ⒷⒺⒺⓈ ⓂⒶⓀⒺ ⒽⓄⓃⒺⓎ ⒾⓃ ⓉⒽⒺ ⓈⓊⓂⓂⒺⓇ.",
}


@pytest.mark.parametrize("name", sorted(LOOK_ALIKES))
def test_look_alike_capitals_are_not_english_capital_letters(name):
    text = LOOK_ALIKES[name]  # at most 3 words of English capitals (IN, AND, IN)
    assert text.isupper() and not english_letters(text)
    capital = [{"id": "change_case:english_capital", "kwargs": {}}]
    assert IFEvalReward()(text, capital).strict == (False,)
    words = [{"id": "change_case:capital_word_frequency",
              "kwargs": {"capital_frequency": 4, "capital_relation": "at least"}}]  # fmt: skip
    assert IFEvalReward()(text, words).strict == (False,)
    lower = [{"id": "change_case:english_lowercase", "kwargs": {}}]
    assert IFEvalReward()(text.lower(), lower).strict == (False,)
    # English capitals, accents of loanwords included, still pass.
    plain = "BEES MAKE HONEY FOR THE CAFÉ IN THE SUMMER AND REST IN THE WINTER."
    assert IFEvalReward()(plain, capital).strict == (True,)
    assert IFEvalReward()(plain, words).strict == (True,)
    assert IFEvalReward()(plain.lower(), lower).strict == (True,)
