"""Rubrics (issue 41, item 1): named parts with weights, metrics, gates and group parts, sync
and async; the tasks' rewards as rubrics with the values they had (a differential test
against the tasks' own score functions)."""

import asyncio
import functools
import math
import time

import pytest
from gsm8k_fixture import TEST

from llm_gym.rewards import CountdownReward, GSM8KReward
from llm_gym.rubrics import Part, Rubric, TaskScore
from llm_gym.tasks import countdown as countdown_module
from llm_gym.tasks import countdown_task, gsm8k_task, products_task
from llm_gym.tasks import gsm8k as gsm8k_module
from llm_gym.tasks import products as products_module

ITEM = {"answer": "4"}


def right(response, item):
    return float(response.strip() == item["answer"])


def test_the_reward_is_the_weighted_sum_of_reward_parts_while_every_gate_holds():
    rubric = Rubric(
        [
            Part("right", right, weight=2.0),
            Part("polite", lambda r, i: float("please" in r), weight=0.5),
            Part("short", lambda r, i: float(len(r) < 12), role="gate"),
            Part("length", lambda r, i: len(r), role="metric"),
        ]
    )
    score = rubric("4", ITEM)
    assert score == TaskScore(2.0, {"right": 1.0, "polite": 0.0, "short": 1.0, "length": 1.0})
    assert rubric("please 4", ITEM).reward == 0.5  # not right: only the polite part pays
    assert rubric("4" + " " * 20, ITEM).reward == 0.0  # right, but the gate fails
    assert rubric("4" + " " * 20, ITEM).answered is False  # a failed gate is no answer
    assert rubric("4" + " " * 20, ITEM).info["right"] == 1.0  # yet every part is reported


def test_a_part_returning_a_task_score_keeps_its_info_and_its_answered():
    rubric = Rubric([Part("task", lambda r, i: TaskScore(0.1, {"why": "format"}, False))])
    assert rubric("x", ITEM) == TaskScore(0.1, {"why": "format", "task": 0.1}, False)
    pair = Rubric([Part("task", lambda r, i: (0.5, {"n": 1}))])
    assert pair("x", ITEM) == TaskScore(0.5, {"n": 1, "task": 0.5}, True)


def test_group_parts_see_the_whole_group_and_are_skipped_for_one_response():
    def rank(responses, items):  # the shorter, the better: 1, 0.5, 0
        order = sorted(range(len(responses)), key=lambda k: len(responses[k]))
        values = [0.0] * len(responses)
        for place, k in enumerate(order):
            values[k] = 1 - place / (len(responses) - 1)
        return values

    rubric = Rubric([Part("right", right), Part("rank", rank, weight=0.5, group=True)])
    scores = rubric.score_group(["4", "4   ", "5 5"], [ITEM] * 3)
    assert [s.reward for s in scores] == [1.5, 1.0, 0.25]
    assert [s.info["rank"] for s in scores] == [1.0, 0.0, 0.5]
    assert rubric("4", ITEM) == TaskScore(1.0, {"right": 1.0})  # no group: not scored
    # several groups at once: each ranked within itself
    batch = rubric.score_batch(["4", "44", "5", "555"], [ITEM] * 4, groups=[[0, 1], [2, 3]])
    assert [s.info["rank"] for s in batch] == [1.0, 0.0, 1.0, 0.0]


def test_async_parts_run_concurrently_and_a_slow_one_times_out():
    async def judge(response, item):
        await asyncio.sleep(0.3)
        return right(response, item)

    rubric = Rubric([Part("judge", judge)], timeout_s=5)
    started = time.monotonic()
    scores = rubric.score_batch(["4"] * 8, [ITEM] * 8)
    assert [s.reward for s in scores] == [1.0] * 8
    assert time.monotonic() - started < 8 * 0.3  # together, not one after another

    async def hang(response, item):
        await asyncio.sleep(30)
        return 1.0

    slow = Rubric([Part("right", right), Part("hang", hang)], timeout_s=0.2)
    score = slow("4", ITEM)
    assert score.reward == 1.0 and score.info["hang"] == 0.0
    assert "timeout_s=0.2" in score.info["rubric_errors"]["hang"]


def test_a_rubric_scores_inside_a_running_event_loop():
    async def judge(response, item):
        return right(response, item)

    async def caller():
        # a sync caller (an env's step) inside async code: no "loop already running" error
        one = Rubric([Part("judge", judge)])("4", ITEM).reward
        many = await Rubric([Part("judge", judge)]).ascore_batch(["4", "5"], [ITEM] * 2)
        return one, [s.reward for s in many]

    assert asyncio.run(caller()) == (1.0, [1.0, 0.0])


@pytest.mark.parametrize(
    ("fn", "error"),
    [
        (lambda r, i: 1 / 0, "ZeroDivisionError"),
        (lambda r, i: math.nan, "not a finite number"),
        (lambda r, i: "1.0", "not a finite number"),
        (lambda r, i: True, "not a finite number"),
    ],
)
def test_a_part_that_fails_raises_or_scores_zero_as_told(fn, error):
    parts = [Part("right", right), Part("bad", fn)]
    score = Rubric(parts, errors="zero")("4", ITEM)
    assert score.reward == 1.0 and score.info["bad"] == 0.0
    assert error in score.info["rubric_errors"]["bad"]
    with pytest.raises((ZeroDivisionError, ValueError), match="division|part 'bad' returned"):
        Rubric(parts)("4", ITEM)  # errors="raise", the default: the caller sees it


def test_a_group_part_with_the_wrong_count_is_each_members_error():
    rubric = Rubric([Part("rank", lambda rs, items: [1.0], group=True)], errors="zero")
    scores = rubric.score_group(["a", "b"], [ITEM] * 2)
    assert [s.reward for s in scores] == [0.0, 0.0]
    assert "one number per response (2)" in scores[0].info["rubric_errors"]["rank"]


@pytest.mark.parametrize(
    ("build", "error", "match"),
    [
        (lambda: Rubric([]), TypeError, "non-empty list of Part"),
        (lambda: Rubric([right]), TypeError, "list of Part, got \\['function'\\]"),
        (lambda: Rubric([Part("a", right), Part("a", right)]), ValueError, "unique"),
        (lambda: Part("a", right, role="bonus"), ValueError, "role"),
        (lambda: Part("a", 3), TypeError, "fn must be callable"),
        (lambda: Part("", right), ValueError, "needs a name"),
        (lambda: Rubric([Part("a", right)], timeout_s=0), ValueError, "timeout_s"),
        (lambda: Rubric([Part("a", right)], errors="ignore"), ValueError, "errors"),
    ],
)
def test_bad_rubrics_name_what_is_wrong(build, error, match):
    with pytest.raises(error, match=match):
        build()


def test_responses_and_items_must_be_as_many():
    with pytest.raises(ValueError, match="as many, got 2 and 1"):
        Rubric([Part("right", right)]).score_batch(["4", "4"], [ITEM])


# -- the tasks' rewards as rubrics: the values they had --------------------------------------

HOSTILE = ["", " ", "<answer>", "\\boxed{", "#### ", "9" * 5000, "<answer>" * 2000]


def gsm8k_cases(mode):
    forms = {"tags": "<think>ok</think><answer>{}</answer>", "hash": "#### {}",
             "boxed": "\\boxed{{{}}}", "last_number": "it is {}"}  # fmt: skip
    cases = []
    for row in TEST:
        number = row["answer"].rsplit("####", 1)[1].strip()
        wrong = str(float(number.replace(",", "")) + 1)
        item = {"query": row["question"], "answer": row["answer"]}
        texts = (forms[mode].format(number), forms[mode].format(wrong), "no answer", *HOSTILE)
        cases += [(text, item) for text in texts]
    return cases


def countdown_cases(mode):
    item = {"query": "q", "numbers": [3, 5], "target": 8}
    wrap = {"tags": "<answer>{}</answer>", "hash": "#### {}", "boxed": "\\boxed{{{}}}"}[mode]
    texts = [wrap.format(e) for e in ("3 + 5", "3 * 5", "3 + 3 + 5", "8", "3 +")]
    return [(text, item) for text in (*texts, "no", *HOSTILE)]


def products_cases(mode):
    item = {"query": "q", "answer": "1302", "factors": [31, 42]}
    wrap = {"tags": "<answer>{}</answer>", "hash": "#### {}", "boxed": "\\boxed{{{}}}",
            "last_number": "so {}"}[mode]  # fmt: skip
    return [(wrap.format(v), item) for v in ("1302", "1,302", "1303", "x")] + [
        (text, item) for text in ("none", *HOSTILE)
    ]


@pytest.mark.parametrize(
    ("name", "task", "old", "cases"),
    [
        *[
            (
                f"gsm8k-{m}",
                gsm8k_task(answer_format=m, dataset=TEST),
                functools.partial(gsm8k_module._score, GSM8KReward(mode=m)),
                gsm8k_cases(m),
            )
            for m in ("tags", "hash", "boxed", "last_number")
        ],
        *[
            (
                f"countdown-{m}",
                countdown_task(answer_format=m),
                functools.partial(countdown_module._score, CountdownReward(m)),
                countdown_cases(m),
            )
            for m in ("tags", "hash", "boxed")
        ],
        *[
            (
                f"products-{m}",
                products_task(answer_format=m),
                functools.partial(products_module._score, m),
                products_cases(m),
            )
            for m in ("tags", "hash", "boxed", "last_number")
        ],
    ],  # fmt: skip
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_each_task_reward_is_a_rubric_with_the_values_it_had(name, task, old, cases):
    assert isinstance(task.reward, Rubric)
    assert [p.name for p in task.reward.parts] == ["format", "right"]
    rewards = set()
    for text, item in cases:
        before, now = TaskScore(*old(text, item)), task.reward(text, item)
        assert now.reward == before.reward, (name, text[:40])
        assert now.answered == before.answered, (name, text[:40])
        assert before.info.items() <= now.info.items()  # TorchRL's parts, as they were
        assert now.info["right"] == before.reward and now.info["format"] in (0.0, 1.0)
        assert "rubric_errors" not in now.info
        rewards.add(now.reward)
    assert {0.0, 1.0} <= rewards  # the cases reach both ends of the reward


# -- in a vector env: one batch a step, group parts over a GRPO group ------------------------


def test_a_vector_env_scores_a_steps_answers_in_one_batch_with_its_groups():
    from llm_gym.envs import DatasetChatEnv, DatasetChatVectorEnv

    batches = []

    async def judge(response, item):  # an async part: called for every answer of the step
        batches.append(response)
        await asyncio.sleep(0.05)
        return right(response, item)

    def shortest(responses, items):
        best = min(map(len, responses))
        return [float(len(r) == best) for r in responses]

    rubric = Rubric([Part("judge", judge), Part("short", shortest, 0.5, group=True)])
    rows = [{"query": "2 + 2?", "answer": "4"}, {"query": "3 + 3?", "answer": "6"}]
    env = DatasetChatEnv(rows, reward=rubric, repeats=2, group_repeats=True, shuffle=False)
    envs = DatasetChatVectorEnv(env, num_envs=4)
    _, infos = envs.reset(seed=0)
    answers = [row["answer"] for row in (rows[0], rows[0], rows[1], rows[1])]
    assert list(infos["answer"]) == answers  # two groups of two, side by side
    started = time.monotonic()
    actions = [answers[0], answers[0] + " ", "77", answers[3]]
    _, rewards, terminated, _, infos = envs.step(actions)
    assert time.monotonic() - started < 4 * 0.05 + 0.15  # the judge calls ran together
    assert batches == actions
    assert list(rewards) == [1.5, 1.0, 0.0, 1.5]  # the shorter of each group gets the bonus
    final = infos["final_info"]  # the finished episodes, reset in the same step
    assert list(final["short"]) == [1.0, 0.0, 0.0, 1.0] and all(terminated)
    # a single env scores without the group part, with the same rubric
    env.reset(seed=0)
    assert env.step(answers[0])[1] == 1.0


# -- issue 53, finding 11: what a part returns, the weighted sum, score_batch's groups -------


def test_numpy_scalars_are_numbers_and_an_overflow_is_the_parts_error():
    import numpy as np

    for value, expected in [(np.float32(0.5), 0.5), (np.int64(2), 2.0), (np.float64(1), 1.0)]:
        score = Rubric([Part("right", right), Part("np", lambda r, i, v=value: v)])("4", ITEM)
        assert score.reward == 1.0 + expected and score.info["np"] == expected
        assert type(score.info["np"]) is float
    huge = [Part("right", right), Part("huge", lambda r, i: 2**2000)]
    score = Rubric(huge, errors="zero")("4", ITEM)  # base: OverflowError, errors= or not
    assert score.reward == 1.0 and score.info["huge"] == 0.0
    assert score.info["rubric_errors"]["huge"] == (
        "ValueError: returned an int of 603 digits, too large for a float: not a finite number"
    )
    with pytest.raises(ValueError, match="rubric part 'huge' returned an int of 603 digits"):
        Rubric(huge)("4", ITEM)
    with pytest.raises(ValueError, match=r"part 'b' returned np.True_, not a finite number"):
        Rubric([Part("b", lambda r, i: np.bool_(True))])("4", ITEM)


def test_a_weighted_sum_past_floats_range_is_an_error_naming_the_part():
    parts = [Part("right", right), Part("big", lambda r, i: 1e308, weight=10)]
    expected = r"rubric part 'big': weight 10 × value 1e\+308 makes the reward inf, not a finite"
    with pytest.raises(ValueError, match=expected):
        Rubric(parts)("4", ITEM)  # base: the reward inf
    score = Rubric(parts, errors="zero")("4", ITEM)
    assert score.reward == 1.0 and score.info["big"] == 0.0
    assert score.info["rubric_errors"]["big"].startswith("ValueError: rubric part 'big'")
    # each product finite, their sum not: the part that tips it over is named
    twice = [Part("a", lambda r, i: 1e308), Part("b", lambda r, i: 1e308)]
    with pytest.raises(ValueError, match="rubric part 'b': weight 1 × value 1e\\+308"):
        Rubric(twice)("4", ITEM)


@pytest.mark.parametrize(
    ("groups", "problem"),
    [
        ([[0, 1], [1, 2], [5]], "index 1 is in group 0 and group 1"),
        ([[0, 1], [5]], "index 5 in group 1 is out of range"),
        ([[0, -1]], "index -1 in group 0 is out of range"),
        ([[0, 0]], "index 0 is twice in group 0"),
        ([[0], []], "group 1 is empty"),
        ([[0, "1"]], "group 0 holds '1', not an index"),
        ([[True]], "group 0 holds True, not an index"),
        ([0, 1], "group 0 is a int, not a list of indices"),
        ("01", "a str"),
    ],
)
def test_score_batch_checks_its_groups(groups, problem):
    ones = Part("n", lambda rs, items: [1.0] * len(rs), group=True)
    rubric = Rubric([Part("right", right), ones])
    expected = "groups must be True, False or lists of response indices (0 to 2, each in one group"
    with pytest.raises(ValueError) as raised:  # base: a bare IndexError, or nothing said
        rubric.score_batch(["4", "4", "5"], [ITEM] * 3, groups=groups)
    assert str(raised.value).startswith(expected) and str(raised.value).endswith(": " + problem)
    # what is right still runs: numpy's ints, tuples, a response in no group
    import numpy as np

    scores = rubric.score_batch(["4", "4", "5"], [ITEM] * 3, groups=[(np.int64(2), 0)])
    assert [s.info.get("n") for s in scores] == [1.0, None, 1.0]
