"""The tool-use demo (issue 27, finding 13): on ``LLMChat-Products-v0`` the default model calls
the ``python`` tool (markdown format) and reads its output; the task's own checks."""

import gymnasium as gym
import pytest

import llm_gym
from llm_gym import TransformersPolicy
from llm_gym.tasks import PRODUCTS_CODE_REQUEST, products_task


@pytest.mark.slow  # the default model's episode with a tool call (about 9 s)
def test_default_model_calls_the_python_tool_and_gets_its_output(smol):
    model, tokenizer = smol
    policy = TransformersPolicy(
        model, tokenizer, generate_kwargs={"max_new_tokens": 64, "do_sample": False}
    )
    env = gym.make("LLMChat-Products-v0", tools=["python"], tool_format="markdown", seed=0)
    calls = 0
    for episode in range(2):
        obs, info = env.reset(seed=episode)
        product = info["answer"]
        obs, reward, terminated, truncated, info = env.step(policy(obs))
        assert (reward, terminated) == (0.0, False)  # the turn called the tool
        (record,) = info["tool_calls"]
        assert record["name"] == "python" and record["ok"], record
        assert "print(" in record["arguments"]["code"]
        # The output comes back as the conversation's tool message, the product in it.
        assert obs["history"][-1] == {"role": "tool", "content": record["output"]}
        assert product in record["output"]
        calls += len(info["tool_calls"])
    assert calls == 2
    env.close()


def test_products_task_questions_and_reward():
    env = gym.make("LLMChat-Products-v0", level=0, ask_for_code=False, seed=3)
    obs, info = env.reset(seed=3)
    question = obs["history"][-1]["content"]
    a, b = (int(n) for n in question.removeprefix("What is ").removesuffix("?").split(" * "))
    assert 10 <= a < 100 and 10 <= b < 100 and info["answer"] == str(a * b)
    assert PRODUCTS_CODE_REQUEST not in question
    _, reward, terminated, _, info = env.step(f"so it is {a * b:,}")
    assert (reward, terminated, info["success"]) == (1.0, True, True)
    env.reset(seed=3)
    assert env.step(f"{a * b + 1}")[1] == 0.0
    assert products_task().answer_format == "last_number"
    assert "LLMChat-Products-v0" in gym.registry and llm_gym.tasks.products_task is products_task


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"level": 5}, "level"),
        ({"ask_for_code": "yes"}, "ask_for_code must be a bool"),
        ({"answer_format": "xml"}, "answer_format"),
    ],
)
def test_products_task_rejects_bad_arguments(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        products_task(**kwargs)
