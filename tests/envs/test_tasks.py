"""The procedural and MATH tasks: Countdown, reasoning-gym, MATH; shared answer formats and
the assistant prefix."""

import json

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from gymnasium.vector import AutoresetMode

import llm_gym  # noqa: F401  (registers the ids)
from llm_gym import Response
from llm_gym.envs import sharded_env_fns
from llm_gym.rewards.countdown import (
    CountdownReward,
    evaluate_expression,
    score_countdown,
    uses_numbers,
)
from llm_gym.rewards.math import MATHReward, math_equal, math_reward_func
from llm_gym.tasks.countdown import COUNTDOWN_SYSTEM_PROMPT
from llm_gym.tasks.math import MATH_SYSTEM_PROMPT

TASKS = {
    "LLMChat-Countdown-v0": {"level": 1},
    "LLMChat-ReasoningGym-v0": {"task": "basic_arithmetic"},
    "LLMChat-Products-v0": {"level": 1},
}
GSM8K_ROWS = [
    {"question": f"What is {a} + {a}?", "answer": f"#### {2 * a}"} for a in range(11)
]  # an epoch that does not divide by 8: the shards wrap into the next one alike
MATH_ROWS = [
    {"problem": "What is half of one?", "solution": r"Half is $\boxed{\frac{1}{2}}$."},
    {"problem": "Compute $2^3$.", "solution": r"$2^3 = \boxed{8}$"},
    {"problem": "Solve $x + 1 = 3$.", "solution": r"So $x = \boxed{2}$."},
]


@pytest.fixture
def math_dir(tmp_path):
    for split, rows in (("train", MATH_ROWS), ("test", MATH_ROWS[:1])):
        with open(tmp_path / f"{split}.jsonl", "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
    return tmp_path


def right_countdown_answer(numbers, target):
    """An expression for a level-0 problem (two numbers), found without evaluating text."""
    a, b = numbers
    ways = {a + b: f"{a} + {b}", a - b: f"{a} - {b}", b - a: f"{b} - {a}", a * b: f"{a} * {b}"}
    return ways[target]


# -- every new task: spaces, modes, vector envs, seeds ------------------------------------


@pytest.mark.parametrize("env_id", [*TASKS, "LLMChat-MATH-v0"])
@pytest.mark.parametrize("mode", ["history", "text", "tokens"])
def test_check_env_in_every_input_mode(env_id, mode, gpt2_tokenizer, math_dir):
    kwargs = TASKS.get(env_id, {"data_dir": math_dir})
    tokenizer = None if mode == "history" else gpt2_tokenizer
    env = gym.make(env_id, input_mode=mode, tokenizer=tokenizer, seed=0, **kwargs)
    check_env(env.unwrapped, skip_render_check=True)
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs) and list(obs) == [mode]
    _, reward, terminated, _, info = env.step("no answer here")
    assert (reward, terminated, info["reward_answer"]) == (0.0, True, 0.0)


@pytest.mark.parametrize("env_id", [*TASKS, "LLMChat-MATH-v0"])
def test_every_task_takes_tools_and_runs_a_python_call(env_id, math_dir):
    kwargs = TASKS.get(env_id, {"data_dir": math_dir})
    env = gym.make(env_id, seed=0, tools=["python"], **kwargs)
    obs, _ = env.reset(seed=0)
    assert '"name": "python"' in obs["history"][0]["content"]
    call = '<tool_call>{"name": "python", "arguments": {"code": "print(6 * 7)"}}</tool_call>'
    obs, reward, terminated, _, info = env.step(call)
    assert obs["history"][-1] == {"role": "tool", "content": "42\n"}
    assert (reward, terminated, info["num_tool_calls"]) == (0.0, False, 1)
    _, _, terminated, _, info = env.step("no answer here")
    assert terminated and info["reward_answer"] == 0.0


@pytest.mark.parametrize("env_id", list(TASKS))
def test_the_same_seed_gives_the_same_questions_in_every_vectorization(env_id):
    def questions(mode, seed):
        if mode == "vector_entry_point":
            envs = gym.make_vec(env_id, num_envs=3, seed=seed, **TASKS[env_id])
        else:  # sub-envs that split one stream, as the native env's do
            fns = sharded_env_fns(env_id, 3, seed=seed, **TASKS[env_id])
            kw = {"shared_memory": False} if mode == "async" else {}
            vector = gym.vector.AsyncVectorEnv if mode == "async" else gym.vector.SyncVectorEnv
            envs = vector(fns, autoreset_mode=AutoresetMode.SAME_STEP, **kw)
        obs, _ = envs.reset(seed=seed)
        seen = [h[-1]["content"] for h in obs["history"]]
        obs, *_ = envs.step(["x"] * 3)  # native: SAME_STEP autoreset serves the next ones
        envs.close()
        return seen

    native = questions("vector_entry_point", 5)
    assert questions("sync", 5) == native == questions("async", 5)
    assert len(set(native)) == 3 and questions("vector_entry_point", 6) != native


@pytest.mark.parametrize("env_id", list(TASKS))
def test_group_repeats_give_a_group_the_same_question(env_id):
    envs = gym.make_vec(env_id, num_envs=4, repeats=2, group_repeats=True, seed=0, **TASKS[env_id])
    obs, _ = envs.reset(seed=0)
    last = [h[-1]["content"] for h in obs["history"]]
    assert last[0] == last[1] and last[2] == last[3] and last[0] != last[2]


@pytest.mark.parametrize("env_id", ["LLMChat-Countdown-v0", "LLMChat-GSM8K-v0"])
def test_shards_serve_a_larger_vector_env_s_sub_envs_items(env_id):
    # Two processes' vector envs of 4 (shards (0, 8) and (4, 8)) play, episode after episode,
    # exactly what one vector env of 8 plays: the split does not change the items.
    kwargs = {"repeats": 2, "group_repeats": True}
    kwargs |= {"level": 1} if "Countdown" in env_id else {"dataset": GSM8K_ROWS}
    whole = gym.make_vec(env_id, num_envs=8, **kwargs)
    parts = [gym.make_vec(env_id, num_envs=4, shards=(k, 8), **kwargs) for k in (0, 4)]
    assert [p.unwrapped.shards for p in parts] == [(0, 8), (4, 8)]

    def prompts(obs):
        return [h[-1]["content"] for h in obs["history"]]

    seen = prompts(whole.reset(seed=5)[0])
    split = [q for p in parts for q in prompts(p.reset(seed=5)[0])]
    for _ in range(3):
        assert split == seen and seen[0] == seen[1] and len(set(seen)) > 1
        seen = prompts(whole.step(["1"] * 8)[0])
        split = [q for p in parts for q in prompts(p.step(["1"] * 4)[0])]
    for bad in [(1, 8), (6, 8), (-4, 8), (0, 7), "0,8", (0.0, 8)]:  # (1, 8): splits a group
        with pytest.raises(ValueError, match=r"shards must be \(first, total\), ints with 0 <="):
            gym.make_vec(env_id, num_envs=4, shards=bad, **kwargs)


# -- Countdown -------------------------------------------------------------------------


def test_countdown_prompt_info_and_exact_rewards():
    env = gym.make("LLMChat-Countdown-v0", level=0, seed=3)
    obs, info = env.reset(seed=3)
    assert obs["history"][0]["content"] == COUNTDOWN_SYSTEM_PROMPT
    numbers, target = info["numbers"], info["target"]
    assert (
        isinstance(target, int) and len(numbers) == 2 and all(isinstance(n, int) for n in numbers)
    )
    assert f"Using the numbers {numbers}" in obs["history"][-1]["content"]
    right = right_countdown_answer(numbers, target)
    cases = [
        (f"<think>try</think><answer>{right}</answer>", 1.0, True),
        (f"<answer>{numbers[0]} + {numbers[0]} + {numbers[1]}</answer>", 0.1, False),  # reuse
        ("<answer>1000</answer>", 0.1, False),  # a number not given
        ("I give up", 0.0, False),
    ]
    for response, reward, success in cases:
        env.reset(options={"item": {"query": "q", "numbers": numbers, "target": target}})
        _, got, terminated, _, info = env.step(response)
        assert (got, info["success"], terminated) == (reward, success, True), response
        assert (info["target"], info["numbers"]) == (target, numbers)


def test_countdown_levels_set_the_count_and_size_of_the_numbers():
    env = gym.make("LLMChat-Countdown-v0", level=0, seed=0)
    assert env.unwrapped.num_levels == 7
    sizes = []
    for level in (0, 4, 6):
        env.unwrapped.set_level(level)
        numbers = env.reset()[1]["numbers"]
        sizes.append(len(numbers))
        assert max(numbers) <= (10 if level == 0 else 100)
    assert sizes == [2, 4, 6]
    fixed = gym.make("LLMChat-Countdown-v0", level=6, num_count=3, max_number=5, seed=0)
    assert all(len(fixed.reset()[1]["numbers"]) == 3 for _ in range(5))


def test_countdown_evaluation_is_safe_and_exact():
    assert evaluate_expression("(25 + 3) * 4") == 112 and evaluate_expression("7 / 2 * 2") == 7
    assert evaluate_expression("-3 + 5") == 2 and uses_numbers("-3 + 5", [5, 3])
    for hostile in [
        "99**98**97",
        "2 ** 10",
        "__import__('os').system('true')",
        "[1] * 9",
        "1 if 1 else 2",
        "(1).__class__",
        "1_000",
        "1e9",
        "0x10",
        "1; 2",
        "9" * 5000,
    ]:
        assert evaluate_expression(hostile) is None, hostile
    assert evaluate_expression("1 / (2 - 2)") is None
    assert uses_numbers("3 * 4 - 2", [2, 3, 4]) and not uses_numbers("3 * 3", [3, 4])
    # Hostile answers get their reward at once, never 1.0, whatever they ask to compute.
    numbers, target = [99, 98, 97], 99**2
    for answer in ["99**98**97", "(" * 5000 + "1" + ")" * 5000, "99*" * 3000 + "99", "9" * 100_000]:
        score = score_countdown(f"<answer>{answer}</answer>", target, numbers)
        assert (score.reward, score.success) == (0.1, False)
    assert score_countdown("<answer>" * 20_000, target, numbers).reward == 0.0


def test_countdown_formats_and_errors():
    assert CountdownReward("boxed")(r"\boxed{3 * 4}", 12, [3, 4]).reward == 1.0
    assert CountdownReward("hash")("so\n#### 3 * 4\n", 12, [3, 4]).reward == 1.0
    env = gym.make("LLMChat-Countdown-v0", answer_format="boxed", seed=0)
    assert "\\boxed{}" in env.reset()[0]["history"][0]["content"]
    cases = [
        (
            {"answer_format": "last_number"},
            ValueError,
            "mode must be one of 'tags', 'hash', 'boxed' for Countdown",
        ),
        ({"level": 7}, ValueError, "level must be an int in \\[0, 6\\], got 7"),
        ({"num_count": 1}, ValueError, "num_count must be None or an int >= 2, got 1"),
        ({"max_target": 0}, ValueError, "max_target must be an int >= 1, got 0"),
        ({"correct_reward": float("nan")}, ValueError, "correct_reward must be finite"),
    ]
    for kwargs, error, match in cases:
        with pytest.raises(error, match=match):
            gym.make("LLMChat-Countdown-v0", **kwargs)
    with pytest.raises(TypeError, match="target must be an int, got str"):
        score_countdown("<answer>1</answer>", "12", [3, 4])


# -- reasoning-gym ---------------------------------------------------------------------


def test_reasoning_gym_scores_with_the_task_verifier():
    env = gym.make(
        "LLMChat-ReasoningGym-v0", task="basic_arithmetic", task_config={"max_terms": 2}, seed=0
    )
    obs, info = env.reset(seed=0)
    truth = info["answer"]
    assert isinstance(truth, str) and info["task"] == "basic_arithmetic"
    assert info["metadata"]["source_dataset"] == "basic_arithmetic"
    _, reward, terminated, _, info = env.step(f"<think>ok</think><answer>{truth}</answer>")
    assert (reward, terminated, info["success"], info["score"]) == (1.0, True, True, 1.0)
    assert set(info) >= {
        "reward_answer",
        "reward_think",
        "reward_right",
        "score",
        "answer",
        "task",
        "metadata",
    }
    env.reset(seed=0)
    assert env.step("<answer>not a number</answer>")[1] == 0.0  # format_reward defaults to 0.0
    floor = gym.make("LLMChat-ReasoningGym-v0", format_reward=0.25, seed=0)
    floor.reset(seed=0)
    assert floor.step("<answer>wrong</answer>")[1] == 0.25
    floor.reset()
    assert floor.step("no tags")[1] == 0.0


def test_reasoning_gym_levels_and_other_tasks():
    env = gym.make(
        "LLMChat-ReasoningGym-v0", task="leg_counting", level=0, seed=1, answer_format="last_number"
    )
    assert env.unwrapped.num_levels > 1 and env.unwrapped.level == 0
    answer = env.reset(seed=1)[1]["answer"]
    assert env.step(f"So the total is {answer}")[1] == 1.0
    env.unwrapped.set_level(env.unwrapped.num_levels - 1)
    assert env.reset()[1]["metadata"]["difficulty"] != {}
    default = gym.make("LLMChat-ReasoningGym-v0", task="leg_counting", level=None)
    assert default.unwrapped.num_levels == 1
    with pytest.raises(ValueError, match="level must be an int in \\[0, 0\\]"):
        default.unwrapped.set_level(1)


def test_reasoning_gym_errors_list_the_valid_choices():
    with pytest.raises(
        ValueError,
        match="task must be a reasoning-gym task, one of \\[.*'basic_arithmetic'.*got 'nope'",
    ):
        gym.make("LLMChat-ReasoningGym-v0", task="nope")
    with pytest.raises(
        ValueError, match="task_config has keys \\['bogus'\\] .* its keys are \\[.*'max_terms'"
    ):
        gym.make("LLMChat-ReasoningGym-v0", task_config={"bogus": 1})
    with pytest.raises(
        ValueError, match="does not fit 'basic_arithmetic' at level 0: max_terms must be"
    ):
        gym.make("LLMChat-ReasoningGym-v0", task_config={"max_terms": 1})
    with pytest.raises(
        ValueError, match="level must be None or an int in \\[0, 4\\] for 'basic_arithmetic', got 9"
    ):
        gym.make("LLMChat-ReasoningGym-v0", level=9)


# -- MATH ------------------------------------------------------------------------------


def test_math_from_a_folder_with_math_verify(math_dir, monkeypatch):
    monkeypatch.setenv("LLM_GYM_MATH_PATH", str(math_dir))
    env = gym.make("LLMChat-MATH-v0", shuffle=False)
    obs, info = env.reset(seed=0)
    assert obs["history"][0]["content"] == MATH_SYSTEM_PROMPT
    assert obs["history"][-1]["content"] == MATH_ROWS[0]["problem"] and "solution" in info
    cases = [
        ("<answer>0.5</answer>", 1.0),
        (r"<answer>\dfrac{1}{2}</answer>", 1.0),
        ("<answer>2</answer>", 0.1),
        ("half", 0.0),
    ]
    for response, reward in cases:
        env.reset(seed=0)
        _, got, _, _, info = env.step(response)
        assert (got, info["answer"]) == (reward, r"\frac{1}{2}"), response
    test = gym.make("LLMChat-MATH-v0", split="test", data_dir=math_dir)
    assert (
        test.unwrapped.source.data[0]["problem"] == MATH_ROWS[0]["problem"]
        and len(test.unwrapped.source) == 1
    )


def test_math_answers_are_compared_safely():
    assert math_equal("x = 2", "2") and math_equal("8", "2^3") and not math_equal("3", "2")
    assert not math_equal("9" * 5000 + "^" + "9" * 5000, "3")  # too long: wrong unread
    assert MATHReward("boxed")(r"thus \boxed{(1, 2)}", r"\boxed{(1,2)}").reward == 1.0
    assert math_reward_func(None, ["<answer>8</answer>", "none"], solution=[r"\boxed{8}"] * 2) == [
        1.0,
        0.0,
    ]


def test_math_missing_data_names_both_options(tmp_path):
    with pytest.raises(
        FileNotFoundError,
        match="MATH's 'train' split was not found: data_dir=.*LLM_GYM_MATH_PATH.*MATH-lighteval",
    ):
        gym.make("LLMChat-MATH-v0", data_dir=tmp_path)
    with pytest.raises(ValueError, match="split must be one of \\('train', 'test'\\), got 'dev'"):
        gym.make("LLMChat-MATH-v0", split="dev")


# -- answer formats and the assistant prefix ----------------------------------------------


@pytest.mark.parametrize(
    "answer_format, instruction, response",
    [
        ("boxed", "\\boxed{}", r"so \boxed{18}"),
        ("hash", "'#### '", "so\n#### 18"),
        ("last_number", "as a number", "9 * 2 = 18"),
    ],
)
def test_gsm8k_answer_formats_ask_for_what_they_score(answer_format, instruction, response):
    rows = [{"question": "9*2?", "answer": "#### 18"}]
    env = gym.make("LLMChat-GSM8K-v0", dataset=rows, answer_format=answer_format)
    obs, _ = env.reset(seed=0)
    assert instruction in obs["history"][0]["content"]
    assert env.step(response)[1] == 1.0
    with pytest.raises(
        ValueError,
        match="answer_format must be one of 'tags', 'hash', 'boxed', 'last_number'; got 'xml'",
    ):
        gym.make("LLMChat-GSM8K-v0", dataset=rows, answer_format="xml")


def test_assistant_prefix_starts_every_turn_in_text_and_tokens(gpt2_tokenizer):
    rows = [{"question": "9*2?", "answer": "#### 18"}]
    env = gym.make(
        "LLMChat-GSM8K-v0",
        dataset=rows,
        input_mode="tokens",
        tokenizer=gpt2_tokenizer,
        observation_keys=("tokens", "text", "history"),
        assistant_prefix="<think>",
        max_turns=2,
    )
    obs, _ = env.reset(seed=0)
    prefix = np.asarray(gpt2_tokenizer("<think>")["input_ids"])
    assert obs["text"].endswith("<think>") and np.array_equal(obs["tokens"][-len(prefix) :], prefix)
    sampled = np.asarray(gpt2_tokenizer("9 times 2 is 18</think>")["input_ids"])
    next_obs, reward, terminated, _, info = env.step(Response("9 times 2 is 18</think>", sampled))
    # No answer yet: the episode goes on, and the think part counted with the prefix.
    assert (reward, terminated, info["reward_think"]) == (0.0, False, 1.0)
    assert next_obs["history"][-1]["content"] == "<think>9 times 2 is 18</think>"
    tokens = next_obs["tokens"]
    assert np.array_equal(
        tokens[: len(obs["tokens"]) + len(sampled)], np.r_[obs["tokens"], sampled]
    )
    assert np.array_equal(tokens[-len(prefix) :], prefix) and next_obs["text"].endswith("<think>")
    with pytest.raises(ValueError, match="assistant_prefix needs input_mode 'text' or 'tokens'"):
        gym.make("LLMChat-GSM8K-v0", dataset=rows, assistant_prefix="<think>")
    with pytest.raises(TypeError, match="assistant_prefix must be a str, got int"):
        gym.make("LLMChat-GSM8K-v0", dataset=rows, assistant_prefix=3)


# -- the curriculum ------------------------------------------------------------------------
