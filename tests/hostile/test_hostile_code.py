"""Hostile programs against the HumanEval grader and the Python sandbox (issue 43): an
always-equal object, patched builtins, early exits, a program that forges its answers, and a
root-only host file. Each case scored full marks (or read the file) before the fix."""

import os
import random
import shutil
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import pytest

import llm_gym  # noqa: F401  (registers the ids)
from llm_gym.rewards.code import extract_code, grade, split_check
from llm_gym.tasks.humaneval import load_humaneval
from llm_gym.tools.interpreter import PythonInterpreter

PROBLEMS = load_humaneval()
SANDBOX = PythonInterpreter(timeout=5)

ALWAYS_EQUAL = """\
    class AlwaysEqual:
        def __eq__(self, other):
            return True

        def __ne__(self, other):
            return False

        __hash__ = object.__hash__

    return AlwaysEqual()
"""


def score(problem, body, *, interpreter=SANDBOX):
    """Grade a body completing the problem's prompt, with the prompt, as the env does."""
    program = extract_code(body, problem["prompt"], problem["entry_point"], "function")
    return grade(program, problem["test"], problem["entry_point"], interpreter,
                 prompt=problem["prompt"])  # fmt: skip


def test_an_always_equal_object_scores_zero():
    result = score(PROBLEMS[0], ALWAYS_EQUAL)
    assert (result.passed, result.total, result.reward) == (0, 7, 0.0)
    assert result.error is None  # the program answered every call: its answers were wrong
    env = gym.make("LLMChat-HumanEval-v0", shuffle=False)
    _, info = env.reset(seed=0)
    answer = f"```python\n{info['prompt']}{ALWAYS_EQUAL}```"
    _, reward, _, _, info = env.step(answer)
    assert (reward, info["success"], info["tests_passed"]) == (0.0, False, 0)


# What the function patches in the interpreter it runs in before returning a constant; the
# old harness ran the asserts in that interpreter, and two of these fooled it.
PATCHED = {
    # it ran each assert through exec: after a no-op exec every later assert "passed"
    "exec": (0, "builtins.exec = lambda *args, **kwargs: None", "True"),
    # truncate_number's tests compare abs(candidate(x) - y) < 1e-6
    "abs": (2, "builtins.abs = lambda x: 0", "0.5"),
    "isinstance": (0, "builtins.isinstance = lambda *a: True", "None"),
    "AssertionError": (0, "builtins.AssertionError = type('Quiet', (Exception,), {})", "None"),
}


@pytest.mark.parametrize("name", sorted(PATCHED))
def test_patched_builtins_change_nothing_outside_the_program(name):
    index, patch, value = PATCHED[name]
    result = score(PROBLEMS[index], f"    import builtins\n    {patch}\n    return {value}\n")
    # Only the asserts the returned constant really satisfies pass: has_close_elements
    # expects True 4 times of 7, truncate_number 0.5 once of 3.
    # (A patched isinstance breaks the program's own json: it stops answering, still 0.)
    right = {"exec": 4, "abs": 1, "isinstance": 0, "AssertionError": 0}[name]
    assert (result.passed, result.success) == (right, False), result


@pytest.mark.parametrize(
    "exit_call", ["__import__('os')._exit(0)", "__import__('sys').exit(0)", "raise SystemExit"]
)
def test_exiting_before_the_tests_scores_zero(exit_call):
    problem = PROBLEMS[0]
    program = f"{exit_call}\n{problem['prompt']}{problem['canonical_solution']}"
    result = grade(program, problem["test"], problem["entry_point"], SANDBOX)
    assert (result.passed, result.total) == (0, 7)
    assert result.error == "the program ended before replying"


def test_assert_true_tests_do_not_count_once_the_program_is_gone():
    # HumanEval/64 ends with `assert True` statements: a dead program gets none of them.
    problem = PROBLEMS[64]
    assert "assert True" in problem["test"]
    program = f"{problem['prompt']}    __import__('os')._exit(0)\n"
    result = grade(program, problem["test"], problem["entry_point"], SANDBOX)
    assert result.passed == 0 and result.error == "the program ended before replying"


def test_only_the_calls_answered_before_an_exit_count():
    problem = PROBLEMS[0]  # has_close_elements: 7 asserts, one call each
    body = problem["canonical_solution"].replace(
        "    for idx", "    global calls\n    calls = globals().get('calls', 0) + 1\n"
        "    if calls == 4:\n        __import__('os')._exit(0)\n    for idx", 1
    )  # fmt: skip
    assert body != problem["canonical_solution"]
    result = score(problem, body)
    assert (result.passed, result.total) == (3, 7)
    assert result.error == "the program ended before replying"


def test_the_first_ten_canonical_solutions_score_one_through_the_env():
    env = gym.make("LLMChat-HumanEval-v0", shuffle=False)
    rewards = []
    for episode in range(10):
        _, info = env.reset(seed=0 if episode == 0 else None)
        answer = f"```python\n{info['prompt']}{info['canonical_solution']}```"
        rewards.append((info["task_id"], env.step(answer)[1]))
    assert [r for _, r in rewards] == [1.0] * 10, rewards
    assert [t for t, _ in rewards] == [f"HumanEval/{i}" for i in range(10)]


def test_the_check_runs_with_a_private_random_generator():
    random.seed(5)
    state = random.getstate()
    problem = PROBLEMS[53]  # its check draws 200 numbers from random
    assert score(problem, problem["canonical_solution"]).success
    assert random.getstate() == state


def test_values_that_are_not_plain_data_fail_only_their_test():
    problem = PROBLEMS[0]
    # A set is plain data but not a bool: all 7 fail, the program keeps answering.
    result = score(problem, "    return {1, 2}\n")
    assert (result.passed, result.error) == (0, None)
    # A generator is not plain data: the call fails (TypeError), the next calls still work.
    result = score(problem, "    return (x for x in numbers)\n")
    assert (result.passed, result.error) == (0, None)


def test_a_program_that_never_answers_is_bounded_by_the_timeout():
    quick = PythonInterpreter(timeout=2)
    start = time.monotonic()
    result = score(PROBLEMS[0], "    import time\n    time.sleep(60)\n", interpreter=quick)
    assert time.monotonic() - start < 30  # the 2-s wall clock, not the 60-s sleep
    assert result.passed == 0 and "ran past the 2 s limit" in result.error


# -- the sandbox: no file only root may read -----------------------------------------------


@pytest.fixture
def open_folder():
    """A folder anyone may enter (pytest's own tmp_path sits in a root-only one)."""
    folder = tempfile.mkdtemp(prefix="llm_gym-test-")
    os.chmod(folder, 0o755)
    yield Path(folder)
    shutil.rmtree(folder)


@pytest.mark.skipif(
    os.geteuid() != 0,
    reason="the sandbox hands the code to another user only when started as root; started "
    "as a user, its code runs as that user, who may read the user's own files (docs say so)",
)
def test_the_sandbox_reads_world_readable_files_but_not_root_only_ones(open_folder):
    folder = open_folder
    secret, public = folder / "secret.txt", folder / "public.txt"
    secret.write_text("hunter2")
    public.write_text("hello")
    os.chmod(secret, 0o600)
    os.chmod(public, 0o644)
    assert os.stat(secret).st_uid == 0
    code = (
        f"print(open({str(public)!r}).read())\n"
        f"try:\n    print(open({str(secret)!r}).read())\n"
        "except PermissionError as error:\n    print('PermissionError', error.errno)\n"
    )
    result = SANDBOX.run(code)
    assert result.ok, result.output
    assert result.output == "hello\nPermissionError 13\n"
    # /etc/shadow too (0640 root:shadow where it exists), and the code is not root.
    who = SANDBOX.run("import os; print(os.getuid(), os.getgid(), os.getgroups())")
    assert who.output == "65534 65534 []\n"
    if os.path.exists("/etc/shadow") and not os.stat("/etc/shadow").st_mode & 0o004:
        shadow = SANDBOX.run("open('/etc/shadow').read()")
        assert not shadow.ok and "PermissionError" in shadow.output


def test_a_served_program_that_never_replies_is_cut_at_the_timeout():
    quick = PythonInterpreter(timeout=2)
    start = time.monotonic()
    reply, result = quick.serve("import time\ntime.sleep(60)", lambda c: (c.request(b"x"), c.error))
    assert time.monotonic() - start < 30
    assert reply == (None, "the program ran out of time") and result.timed_out


# -- issue 53, finding 12: tests that test nothing, and a program that does nothing ------------


def test_assert_true_is_no_test():
    # starts_one_ends: 5 asserts call the candidate, 2 are `assert True, "..."`.
    problem = PROBLEMS[83]
    _, statements = split_check(problem["test"], problem["entry_point"])
    assert [source[:11] for source, is_test in statements if not is_test] == ["assert True"] * 2
    assert sum(is_test for _, is_test in statements) == 5
    assert (score(problem, "    return None\n").passed, score(problem, "    return 1\n").passed,
            score(problem, problem["canonical_solution"]).total) == (0, 1, 5)  # fmt: skip


def test_an_assert_on_a_value_the_candidate_computed_is_a_test():
    test = ("def check(candidate):\n    f = candidate\n    for x in [1, 2]:\n"
            "        y = f(x)\n        assert abs(y - x) < 1\n    z = candidate(0)\n"
            "    assert z == 0\n    assert len('ab') == 2, 'no call'\n")  # fmt: skip
    assert [is_test for _, is_test in split_check(test)[1]] == [False, True, False, True, False]


# Problems whose checks `return None` passed part of (0.33 / 0.33 / 0.67 / 0.67 / 0.5 / 0.3 /
# 0.22 / 0.4 / 0.29 on the base commit): `assert True` lines, `assert not candidate(...)`,
# `assert candidate([]) == None`.
NONE_PAID = (12, 52, 56, 61, 90, 128, 137, 162, 83)


@pytest.mark.parametrize("index", NONE_PAID)
def test_returning_none_scores_zero(index):
    problem = PROBLEMS[index]
    result = score(problem, "    return None\n")
    assert (result.passed, result.reward, result.error) == (0, 0.0, None), result
    assert score(problem, problem["canonical_solution"]).reward == 1.0


def test_tests_none_passes_count_beside_one_it_fails():
    problem = PROBLEMS[56]  # correct_bracketing: 4 asserts expect True, 8 `assert not`
    always_false = score(problem, "    return False\n")
    assert (always_false.passed, always_false.uncredited, always_false.total) == (0, 8, 12)
    always_true = score(problem, "    return True\n")
    assert (always_true.passed, always_true.uncredited, always_true.reward) == (4, 0, 4 / 12)
    # Right on 10 of 12 (4 expecting True, 6 `assert not`): all 10 count.
    balanced = score(problem, "    return brackets.count('<') == brackets.count('>')\n")
    assert (balanced.passed, balanced.uncredited) == (10, 0)
    env = gym.make("LLMChat-HumanEval-v0", dataset=[problem])
    _, info = env.reset(seed=0)
    _, reward, _, _, info = env.step(f"```python\n{info['prompt']}    return False\n```")
    assert (reward, info["tests_passed"], info["tests_uncredited"]) == (0.0, 0, 8)
