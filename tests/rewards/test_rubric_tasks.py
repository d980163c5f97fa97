"""The rewards of MATH, reasoning-gym, HumanEval and IFEval as Rubrics (issue 41, item 1): the
same reward, ``answered`` and ``info`` as the tasks paid before, a differential test against
their score functions as they were (copied here from the modules, before the change), on
right, wrong, unformatted, empty and hostile responses in every answer format."""

import json
import threading

import pytest

from llm_gym.rewards.answers import score_answer
from llm_gym.rewards.code import MAX_CODE_CHARS, CodeScore, extract_code, grade
from llm_gym.rewards.ifeval import IFEvalReward
from llm_gym.rewards.math import MATHReward, boxed_answer
from llm_gym.rubrics import Rubric, TaskScore
from llm_gym.tasks import humaneval as humaneval_module

FORMATS = ("tags", "hash", "boxed", "last_number")
ANSWER_PARTS = [("format", "gate"), ("right", "reward")]  # answer_rubric's
# Answer-free hostile text: what no format reads as an answer, or reads and grades safely.
HOSTILE = [
    "",
    " \n\t ",
    "<answer>",
    "</answer><answer>",
    "\\boxed{",
    "\\boxed{}",
    "}}}{{{\\boxed{{{{",
    "#### ",
    "<answer>" * 2000,
    "{" * 3000 + "}" * 2999,
    "\u202e\u200b\ufeff𝟘𝟙²³ ٣ 〇 \x00 ﷽ 🙂",
    "x" * 100_000,
]


def wrap(answer_format, answer):
    """``answer`` given in ``answer_format``."""
    return {
        "tags": f"<think>so</think> <answer>{answer}</answer>",
        "hash": f"I reason.\n#### {answer}",
        "boxed": f"I reason, so \\boxed{{{answer}}}.",
        "last_number": f"I reason, so {answer}",
    }[answer_format]


def typed(value):
    """``value`` as JSON, so that ``True`` and ``1.0``, or ``1`` and ``1.0``, differ."""
    return json.dumps(value, sort_keys=True, default=repr)


def assert_same(before, now, parts, where):
    """``now`` (the rubric's score) pays and says what ``before`` (the old score) did; its
    ``info`` holds the old ``info`` exactly, plus the part values under ``parts``' names
    (none of them an old key: nothing old is overwritten)."""
    before = TaskScore(*before)
    assert isinstance(now, TaskScore), where
    assert typed(now.reward) == typed(before.reward), where
    assert now.answered is before.answered, where
    assert set(parts).isdisjoint(before.info), where
    assert set(now.info) == set(before.info) | set(parts), where
    kept = {key: value for key, value in now.info.items() if key not in parts}
    assert kept == before.info and typed(kept) == typed(before.info), where
    assert "rubric_errors" not in now.info, where


# -- MATH ----------------------------------------------------------------------------------

MATH_ROWS = [
    {"problem": "Half of one?", "solution": r"Half is $\boxed{\frac{1}{2}}$."},
    {"problem": "Sine of 60?", "solution": r"So $\boxed{\frac{\sqrt{3}}{2}}$."},
    {"problem": "Compute $2^3$.", "solution": r"$2^3 = \boxed{8}$"},
    {"problem": "No box.", "solution": "The answer is 12"},
]
# Per row: answers that are right (some only symbolically), and wrong ones.
MATH_RIGHT = [["0.5", r"\dfrac{1}{2}", "1/2"], [r"\sqrt{3}/2"], ["8", "2^3"], ["The answer is 12"]]
MATH_WRONG = ["2", r"\frac{1}{3}", r"\boxed{\boxed{1}}", r"{{\frac{1}{2}}", "9^{9^{9}}", "9" * 600]


def old_math_score(reward, response, item):
    """MATH's score function as the task module had it before the rubric."""
    score = reward(response, item["solution"])
    info = score.info() | {"answer": boxed_answer(item["solution"])}
    return TaskScore(score.reward, info, answered=score.reward_answer > 0)


@pytest.mark.parametrize("answer_format", FORMATS)
def test_math_reward_is_a_rubric_with_the_values_it_had(answer_format):
    from llm_gym.tasks.math import math_task

    task = math_task(dataset=MATH_ROWS, answer_format=answer_format)
    assert isinstance(task.reward, Rubric)
    assert [(p.name, p.role) for p in task.reward.parts] == ANSWER_PARTS
    old = MATHReward(answer_format, 1.0, 0.1)
    rewards, reasons = set(), set()
    for row, right in zip(MATH_ROWS, MATH_RIGHT, strict=True):
        item = {"query": row["problem"], "solution": row["solution"]}
        answers = [wrap(answer_format, a) for a in [*right, *MATH_WRONG]]
        for text in [*answers, "I do not know.", *HOSTILE]:
            before, now = old_math_score(old, text, item), task.reward(text, item)
            assert_same(before, now, ("format", "right"), (answer_format, text[:40]))
            assert now.info["right"] == before.reward
            assert now.info["format"] == float(before.info["reward_answer"] > 0)
            rewards.add(now.reward)
            reasons.add(now.info.get("reason", "")[:8])
    assert {0.0, 0.1, 1.0} <= rewards
    if answer_format != "last_number":  # a tower or 600 digits is no last number
        assert {"", "refused:"} <= reasons  # refused answers score 0, as they did


def test_math_with_other_reward_values():
    from llm_gym.tasks.math import math_task

    task = math_task(dataset=MATH_ROWS, correct_reward=2.0, format_reward=0.5)
    old = MATHReward("tags", 2.0, 0.5)
    item = {"query": "q", "solution": MATH_ROWS[0]["solution"]}
    paid = []
    for text in ("<answer>0.5</answer>", "<answer>7</answer>", "none"):
        before, now = old_math_score(old, text, item), task.reward(text, item)
        assert_same(before, now, ("format", "right"), text)
        paid.append(now.reward)
    assert paid == [2.0, 0.5, 0.0]


# -- reasoning-gym -------------------------------------------------------------------------


def old_reasoning_gym_score(generator, answer_format, format_reward, response, item):
    """reasoning-gym's score function as the task module had it before the rubric."""
    import copy

    scores = []

    def grade_answer(answer):
        scores.append(generator.score(answer, item))
        return scores[-1]

    score = score_answer(
        response, answer_format, grade_answer, format_reward=format_reward, numeric=False
    )
    info = score.info() | {
        "score": scores[-1] if scores else 0.0,
        "answer": item["answer"],
        "task": item["task"],
        "metadata": copy.deepcopy(item["metadata"]),
    }
    return TaskScore(score.reward, info, answered=score.reward_answer > 0)


@pytest.mark.parametrize("answer_format", FORMATS)
@pytest.mark.parametrize("format_reward", [0.0, 0.25])
@pytest.mark.parametrize("name", ["basic_arithmetic", "spell_backward"])
def test_reasoning_gym_reward_is_a_rubric_with_the_values_it_had(
    name, format_reward, answer_format
):
    pytest.importorskip("reasoning_gym")
    from llm_gym.tasks.reasoning_gym import ReasoningGymGenerator, reasoning_gym_task

    task = reasoning_gym_task(task=name, answer_format=answer_format, format_reward=format_reward)
    assert isinstance(task.reward, Rubric)
    assert [(p.name, p.role) for p in task.reward.parts] == ANSWER_PARTS
    generator = ReasoningGymGenerator(name)
    task.source.reseed(0)
    rewards = set()
    for _ in range(3):
        item = task.source.next_item()
        truth = item["answer"]
        answers = [truth, truth[:-1] or "x", truth + "x", "-" + truth, "{" + truth + "}", "7"]
        for text in [*(wrap(answer_format, a) for a in answers), "no answer", *HOSTILE]:
            before = old_reasoning_gym_score(generator, answer_format, format_reward, text, item)
            now = task.reward(text, item)
            assert_same(before, now, ("format", "right"), (name, answer_format, text[:40]))
            assert now.info["right"] == before.reward
            assert now.info["format"] == before.info["reward_answer"]
            rewards.add(now.reward)
    if name == "spell_backward" and answer_format == "last_number":
        assert rewards == {0.0, format_reward}  # a reversed word is no number: never right
    else:
        assert {0.0, 1.0} <= rewards
    if name == "spell_backward" and answer_format != "last_number":
        assert any(0.0 < r < 1.0 and r != format_reward for r in rewards)  # partial credit


# -- HumanEval -----------------------------------------------------------------------------


def old_humaneval_score(interpreter, code_format, response, item):
    """HumanEval's score function as the task module had it before the rubric."""
    program = extract_code(response, item["prompt"], item["entry_point"], code_format)
    score = grade(program, item["test"], item["entry_point"], interpreter, prompt=item["prompt"])
    info = {
        "success": score.success,
        "tests_passed": score.passed,
        "tests": score.total,
        "task_id": item["task_id"],
    }
    if score.error is not None:
        info["error"] = score.error
    return TaskScore(score.reward, info, answered=program is not None)


def humaneval_cases(problem, code_format):
    """Responses in ``code_format``: right, partly right, wrong, one that stops answering, and
    ones with no code."""
    prompt, solution = problem["prompt"], problem["canonical_solution"]
    bodies = [solution, "    return True\n", "    return None\n", "    raise SystemExit(3)\n"]
    if code_format == "code_block":
        texts = [f"Here:\n```python\n{prompt}{body}```\nDone." for body in bodies]
        texts.append(f"```python\n{prompt}{solution}")  # an unclosed block: no code
        texts.append("```python\n" + "{" * 2000 + "```")  # code that does not compile
    else:
        texts = [prompt + body for body in bodies] + ["def f(:\n    return {{{"]
    return [*texts, "no code here", "", "\u202e\u200b🙂", "x" * (MAX_CODE_CHARS + 1)]


@pytest.mark.parametrize("code_format", ["code_block", "function"])
def test_humaneval_reward_is_a_rubric_with_the_values_it_had(code_format):
    from llm_gym.tasks.humaneval import humaneval_task, load_humaneval

    problems = load_humaneval()[:1]
    task = humaneval_task(code_format=code_format, timeout=5, dataset=problems)
    assert isinstance(task.reward, Rubric) and task.concurrent_reward
    parts = [(p.name, p.role) for p in task.reward.parts]
    assert parts == [("format", "gate"), ("pass_fraction", "reward")]
    interpreter = task.reward.parts[1].fn.args[0]  # the task's sandbox, for the old score
    assert interpreter.timeout == 5
    item = task.source[0]
    rewards, errors = [], []
    for text in humaneval_cases(problems[0], code_format):
        before = old_humaneval_score(interpreter, code_format, text, item)
        now = task.reward(text, item)
        assert_same(before, now, ("format", "pass_fraction"), (code_format, text[:40]))
        assert now.info["pass_fraction"] == before.reward
        assert now.info["format"] == float(before.answered)
        rewards.append(now.reward)
        errors.append(now.info.get("error"))
    assert rewards[:4] == [1.0, 4 / 7, 0.0, 0.0]  # right, 4 of 7 asserts, wrong, stopped
    assert errors[0] is None and errors[-1] == "no code in the response"


def test_humaneval_grades_a_vector_envs_answers_at_once(monkeypatch):
    """``concurrent_reward=True`` as it was: the sub-envs' programs are graded together
    (through the rubric's batch), not one after another."""
    from llm_gym.envs import DatasetChatEnv, DatasetChatVectorEnv
    from llm_gym.tasks.humaneval import humaneval_task, load_humaneval

    barrier = threading.Barrier(3, timeout=30)  # breaks unless 3 grades run at once
    threads = set()

    def meeting(program, test, entry_point, interpreter, *, prompt=""):
        threads.add(threading.get_ident())
        barrier.wait()
        return CodeScore(passed=1, total=1)

    # The grader every answer goes through (the task's public import of rewards.code.grade).
    monkeypatch.setattr(humaneval_module, "grade", meeting)
    task = humaneval_task(dataset=load_humaneval()[:3])
    envs = DatasetChatVectorEnv(DatasetChatEnv.from_task(task, shuffle=False), 3)
    _, info = envs.reset(seed=0)
    answers = [f"```python\n{prompt}    pass\n```" for prompt in info["prompt"]]
    _, rewards, terminated, _, info = envs.step(answers)
    assert rewards.tolist() == [1.0, 1.0, 1.0] and terminated.all() and len(threads) == 3
    assert list(info["final_info"]["pass_fraction"]) == [1.0, 1.0, 1.0]


# -- IFEval --------------------------------------------------------------------------------

IFEVAL_RESPONSES = [
    "bees make honey all summer long",
    "BEES MAKE HONEY ALL SUMMER LONG.",
    "Sure, here it is:\nbees make honey, all summer long.\n*the end*",
    '"<<A Title>>\n\nBees hum all day.\n\nP.S. they sleep at night."',
    "* one\n* two\n* three\n\n***\n\nSECTION 1\nSection 2 [name] [place]",
    '```json\n{"bees": "honey", "n": [1, 2, {"a": {}}]}\n```',
    "Write a poem about honey bees. " + "word " * 400 + "Is there anything else I can help with?",
    "Ceci est une réponse en français, écrite pour les abeilles et le miel.",
    "{" * 5000,
    "[" * 7000 + "]" * 900,
    "\u202e\u200b🙂 ﷽ \x00 𝟘𝟙",
    "x" * 9000,  # over max_response_chars: fails every constraint unread
    "",
]


def old_ifeval_score(reward, response, item):
    """IFEval's score function as the task module had it before the rubric."""
    score = reward(response, item["constraints"])
    return TaskScore(score.reward, score.info())


@pytest.mark.parametrize(
    "options", [{}, {"loose": True}, {"all_or_nothing": True}, {"max_response_chars": 100}]
)
def test_ifeval_reward_is_a_rubric_with_the_values_it_had(options):
    pytest.importorskip("if_verifiable")
    from llm_gym.tasks.ifeval import IFEVAL_LEVELS, ifeval_prompt, ifeval_task

    task = ifeval_task(**options)
    assert isinstance(task.reward, Rubric)
    assert [(p.name, p.role) for p in task.reward.parts] == [("followed", "reward")]
    old = IFEvalReward(
        options.get("all_or_nothing", False),
        options.get("loose", False),
        options.get("max_response_chars", 8000),
    )
    rewards = set()
    items = [ifeval_prompt(0, i, level) for level in range(len(IFEVAL_LEVELS)) for i in (0, 1)]
    items.append(ifeval_prompt(0, 0, 0, instruction_ids=("punctuation:no_comma",)))
    for item in items:
        for text in IFEVAL_RESPONSES:
            before, now = old_ifeval_score(old, text, item), task.reward(text, item)
            assert_same(before, now, ("followed",), (options, item["query"][-40:], text[:40]))
            assert now.info["followed"] == before.reward == before.info["reward"]
            # each constraint's verdicts, as they were
            verdicts = [(c["id"], c["strict"], c["loose"]) for c in now.info["constraints"]]
            assert [c["id"] for c in item["constraints"]] == [v[0] for v in verdicts]
            rewards.add(now.reward)
    assert {0.0, 1.0} <= rewards
    if not options.get("all_or_nothing"):
        assert any(0.0 < r < 1.0 for r in rewards)  # partial credit at 2+ constraints


def test_ifeval_env_step_info_keeps_its_keys():
    pytest.importorskip("if_verifiable")
    import gymnasium as gym

    import llm_gym  # noqa: F401  (registers the ids)

    env = gym.make("LLMChat-IFEval-v0", instruction_ids=["punctuation:no_comma"], seed=0)
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step("Bees hum, all day.")
    assert (reward, terminated, info["followed"], info["strict"], info["success"]) == (
        0.0, True, 0.0, False, False,
    )  # fmt: skip
    assert info["constraints"][0]["strict"] is False and info["strict_fraction"] == 0.0
