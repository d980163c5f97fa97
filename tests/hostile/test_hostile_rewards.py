"""Hostile answers against the answer checks (issue 43): every check bounded in time wherever
it runs, the GIL left free, a refused or timed-out answer scored 0 with its reason.

Before the fix ``\\boxed{9^{9^{9}}}`` made math-verify compute a power tower for minutes on
any thread but the main one, holding the GIL: the cases that could hang run in a child
process with a time limit, so that a regression fails instead of hanging the suite."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from llm_gym.rewards import math as math_rewards
from llm_gym.rewards.countdown import CountdownReward, evaluate_expression
from llm_gym.rewards.gsm8k import GSM8KReward
from llm_gym.rewards.math import MAX_DIGITS, MATHReward, check_math, math_equal

TOWER = r"9^{9^{9}}"  # 9 characters; about 3.7e8 digits
REFUSED = f"refused: about 3.7e+08 digits to compute (the limit is {MAX_DIGITS})"


def run_isolated(script, limit=120):
    """Run ``script`` in a fresh interpreter; its last printed line, read as JSON. A hang
    becomes a failure (TimeoutExpired) after ``limit`` s, not a stuck test session."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True,
                          text=True, timeout=limit, cwd=os.getcwd())  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_tower_is_refused_on_the_main_thread_in_milliseconds():
    math_equal("1", "2")  # start the worker: its import is not the check's time
    start = time.monotonic()
    score = MATHReward()(f"<answer>{TOWER}</answer>", r"\boxed{3}")
    assert time.monotonic() - start < 30
    assert (score.reward, score.reward_answer, score.success) == (0.0, 1.0, False)
    assert score.reason == REFUSED and score.info()["reason"] == REFUSED


def test_the_tower_is_refused_in_a_worker_thread_and_the_gil_stays_free():
    result = run_isolated(
        """
        import json, threading, time
        from llm_gym.rewards.math import MATHReward

        box = {}

        def score():
            start = time.monotonic()
            box["score"] = MATHReward()("<answer>9^{9^{9}}</answer>", r"\\boxed{3}").info()
            box["seconds"] = time.monotonic() - start

        worker = threading.Thread(target=score, daemon=True)
        worker.start()
        ticks = 0  # this thread's turns while the other checks: the GIL is not held
        while worker.is_alive() and ticks < 3000:
            time.sleep(0.01)
            ticks += 1
        print(json.dumps({**box, "ticks": ticks}))
        """
    )
    assert result["score"]["reward"] == 0.0 and result["score"]["reason"] == REFUSED
    assert result["seconds"] < 30 and result["ticks"] < 3000


def test_a_check_past_its_timeout_scores_zero_with_the_reason_in_a_thread():
    # No digit estimate: the time limit alone must stop the tower.
    box = {}

    def check():
        start = time.monotonic()
        box["verdict"] = check_math(TOWER, "3", timeout=1, max_digits=None)
        box["seconds"] = time.monotonic() - start

    worker = threading.Thread(target=check)
    worker.start()
    worker.join(60)
    assert not worker.is_alive()
    assert box["verdict"].equal is False
    assert box["verdict"].reason.startswith("timed out: the check ran past 1 s")
    assert box["seconds"] < 30
    assert math_equal(r"\frac{1}{2}", "0.5")  # the worker answers the next check


def test_a_worker_that_stops_answering_is_killed_at_the_deadline():
    assert math_equal("2^3", "8")  # a worker is idle now
    worker = math_rewards._IDLE[-1]
    os.kill(worker.process.pid, signal.SIGSTOP)  # it can run neither the check nor its alarm
    start = time.monotonic()
    verdict = check_math(r"\sqrt{4}", "2", timeout=1)
    assert time.monotonic() - start < 30
    assert verdict == math_rewards.MathVerdict(
        False, "timed out: the check ran past 1 s and was killed"
    )
    assert worker.process.poll() is not None and worker not in math_rewards._IDLE
    assert math_equal(r"\sqrt{4}", "2")  # a fresh worker takes over


def test_the_tower_through_async_episodes_on_math(tmp_path):
    rows = [{"problem": "What is 1 + 2?", "solution": r"$\boxed{3}$"}] * 4
    with open(tmp_path / "train.jsonl", "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    result = run_isolated(
        f"""
        import functools, json
        import gymnasium as gym
        import llm_gym
        from llm_gym.episodes import AsyncEpisodes

        env_fn = functools.partial(gym.make, "LLMChat-MATH-v0", data_dir={str(tmp_path)!r})
        answers = ["<answer>9^{{9^{{9}}}}</answer>", "<answer>3</answer>"]
        policy = lambda obs: [answers[i % 2] for i in range(len(obs["history"]))]
        with AsyncEpisodes(env_fn, 2, policy, seed=0, timeout=15) as rollouts:
            records = [e.record() for e in rollouts.play(4)]
        print(json.dumps([[r["response"], r["reward"], r.get("reason")] for r in records]))
        """
    )
    assert len(result) == 4
    for response, reward, reason in result:
        if "9^" in response:
            assert (reward, reason) == (0.0, REFUSED)
        else:
            assert (response, reward, reason) == ("<answer>3</answer>", 1.0, None)


@pytest.mark.parametrize(
    ("answer", "reference", "equal"),
    [
        ("0.5", r"\frac{1}{2}", True),
        (r"\dfrac{1}{2}", r"\frac12", True),
        ("2^{100}", "1267650600228229401496703205376", True),
        ("10^{5000}", "10^{5000}", True),
        (r"\sqrt{10^{5000}}", "10^{2500}", True),
        ("x = 2", "2", True),
        ("(1, 2)", "(1,2)", True),
        (r"\binom{100}{50}", "100891344545564193334812497256", True),
        ("10!", "3628800", True),
        ("3", "2", False),
    ],
)
def test_ordinary_answers_are_checked_as_before(answer, reference, equal):
    assert check_math(answer, reference) == math_rewards.MathVerdict(equal)


@pytest.mark.parametrize(
    "answer",
    [
        TOWER,
        r"((10!)!)!",
        r"(10^{7})!",
        r"\binom{10^{9}}{10^{8}}",
        r"10^{10^{10}}",
        r"\sqrt{9^{9^{9}}}",
        r"1^{9^{9^{9}}}",
        r"\sin(2^{2^{40}})",
    ],
)
def test_numbers_too_large_to_compute_are_refused_unevaluated(answer):
    start = time.monotonic()
    verdict = check_math(answer, "3")
    assert time.monotonic() - start < 30
    assert (
        not verdict.equal
        and verdict.reason.startswith("refused: ")
        and "digits to compute" in verdict.reason
    )


def test_a_long_answer_is_refused_unread_and_scores_zero():
    long = "9" * 100_000  # int() of it raises ValueError (the 4300-digit limit)
    score = MATHReward()(f"<answer>{long}</answer>", r"\boxed{3}")
    assert (score.reward, score.reason) == (0.0, "refused: the answer is over 512 characters")
    assert MATHReward()(f"<answer>{long}</answer>", r"\boxed{" + long + "}").reward == 1.0


def test_hostile_numbers_are_wrong_answers_elsewhere_not_errors():
    long = "9" * 100_000
    start = time.monotonic()
    gsm8k = GSM8KReward()(f"<answer>{long}</answer>", "#### 18")
    assert (gsm8k.reward, gsm8k.success) == (0.1, False)  # a number, wrong: the format reward
    assert GSM8KReward(mode="last_number")(long + " or 1" * 10_000, "#### 1").success
    countdown = CountdownReward()
    for answer in (long, f"{long} * {long}", "99**98**97", "9" * 400 + " / 7", "(" * 300):
        score = countdown(f"<answer>{answer}</answer>", target=8, numbers=[2, 10])
        assert (score.reward, score.success) == (0.1, False), answer
    assert evaluate_expression(long) is None  # over 512 characters: not read
    assert time.monotonic() - start < 30


# -- issue 53, finding 12: an answer scores the same boxed or bare ----------------------------


@pytest.mark.parametrize(
    ("answer", "reference", "reward"),
    [
        (TOWER, r"so \boxed{9^{9^{9}}}", 1.0),  # the same text: equal, nothing computed
        (TOWER, r"\boxed{3}", 0.0),  # refused, boxed or not
        ("0.5", r"\boxed{\frac{1}{2}}", 1.0),
        ("7", r"\boxed{8}", 0.1),  # wrong: the format reward
    ],
)
def test_an_answer_scores_the_same_boxed_or_bare(answer, reference, reward):
    bare = MATHReward()(f"<answer>{answer}</answer>", reference)
    boxed = MATHReward()(rf"<answer>\boxed{{{answer}}}</answer>", reference)
    spaced = MATHReward()(rf"<answer>$ \boxed {{{answer}}} $</answer>", reference)
    assert bare.reward == boxed.reward == spaced.reward == reward
    assert bare.reason == boxed.reason == spaced.reason
    assert check_math(rf"\boxed{{{answer}}}", answer) == math_rewards.MathVerdict(True)
