"""Model output of any shape is a tool error or an invalid move for its own episode, never an
exception out of ``step``; a Response's text and tokens are one response (issue 43)."""

import json

import gymnasium as gym
import numpy as np
import pytest

import llm_gym  # noqa: F401  (registers the ids)
from llm_gym import Response
from llm_gym.envs import make_textarena_vector_env
from llm_gym.tools import Toolbox
from llm_gym.tools.base import check_arguments
from llm_gym.tools.calls import MAX_JSON_DEPTH, ToolCall, parse_tool_calls

ROWS = [
    {"question": "Half of 48, plus 48?", "answer": "#### 72"},
    {"question": "Three times 7?", "answer": "#### 21"},
    {"question": "9 times 2?", "answer": "#### 18"},
]
DEEP = f"arrays and objects nested more than {MAX_JSON_DEPTH} deep"


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


def echo(text: str) -> str:
    """Say the text back.

    Args:
        text: What to say.
    """
    return text


def call(name, **arguments):
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def gsm8k(**kwargs):
    return gym.make("LLMChat-GSM8K-v0", dataset=ROWS[:1], shuffle=False, **kwargs)


def nested(depth):
    value = []
    for _ in range(depth - 1):
        value = [value]
    return value


# -- tool calls ----------------------------------------------------------------------------

HOSTILE_CALLS = [
    ("<tool_call>" + "[" * 100000 + "</tool_call>", f"not valid JSON ({DEEP})"),
    ("<tool_call>" + '{"a":' * 100000 + "</tool_call>", f"not valid JSON ({DEEP})"),
    # Deep enough for dataclasses.asdict and repr to recurse past the limit, not for json.
    (
        '<tool_call>{"name": "echo", "arguments": {"text": ' + "[" * 900 + "]" * 900 + "}}"
        "</tool_call>",
        f"not valid JSON ({DEEP})",
    ),
    (
        '<tool_call>{"name": "echo", "arguments": '
        + json.dumps('{"text": ' + "[" * 5000 + "]" * 5000 + "}")
        + "}</tool_call>",
        f'"arguments" must be a JSON object, got str ({DEEP})',
    ),
    (
        '<tool_call>{"name": "echo", "arguments": {"text": ' + "1" * 5000 + "}}</tool_call>",
        "not valid JSON (Exceeds the limit (4300 digits) for integer string conversion",
    ),
]


@pytest.mark.parametrize("mode", ["history", "tokens"])
@pytest.mark.parametrize("action, message", HOSTILE_CALLS)
def test_a_hostile_tool_call_is_a_tool_error_of_its_episode(
    mode, action, message, smollm2_tokenizer
):
    tokenizer = smollm2_tokenizer if mode == "tokens" else None
    env = gsm8k(tools=[echo], input_mode=mode, tokenizer=tokenizer, max_turns=3)
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(action)
    assert (reward, terminated, truncated) == (0.0, False, False)
    (record,) = info["tool_calls"]
    assert not record["ok"] and record["output"].startswith("Error: ")
    assert message in record["output"]
    assert info["failed_tool_calls"] == 1
    # The episode goes on: the answer is scored as ever.
    obs, reward, terminated, *_ = env.step("<answer>72</answer>")
    assert (reward, terminated) == (1.0, True)


def test_the_products_env_with_its_python_tool_takes_the_issues_calls():
    env = gym.make("LLMChat-Products-v0", tools=["python"], seed=0)
    env.reset(seed=0)
    for body in ("[" * 100000, '{"a":' * 100000):
        obs, reward, terminated, _, info = env.step(f"<tool_call>{body}</tool_call>")
        assert (reward, terminated) == (0.0, False)
        assert DEEP in obs["history"][-1]["content"] and not info["tool_calls"][0]["ok"]
    _, reward, terminated, *_ = env.step(f"It is {env.unwrapped.item['answer']}")
    assert (reward, terminated) == (1.0, True)


def test_odd_text_in_a_call_comes_back_as_text_the_env_can_tokenize(smollm2_tokenizer):
    env = gsm8k(tools=[echo], input_mode="tokens", tokenizer=smollm2_tokenizer, max_turns=4,
                observation_keys=("tokens", "text", "history"))  # fmt: skip
    env.reset(seed=0)
    # A lone surrogate is valid JSON ("\ud800") and decodes to a str no tokenizer takes.
    obs, _, terminated, _, info = env.step('<tool_call>{"name": "echo", "arguments": '
                                           '{"text": "a\\ud800b"}}</tool_call>')  # fmt: skip
    assert info["tool_calls"][0]["output"] == "a\ufffdb" and not terminated
    assert obs["history"][-1] == {"role": "tool", "content": "a\ufffdb"}
    obs, _, _, _, info = env.step(call("echo", text="nul\x00byte"))
    assert info["tool_calls"][0]["output"] == "nul\x00byte"
    big = "x" * 1_000_000  # a megabyte of text: the tool message keeps its ends
    obs, _, _, _, info = env.step(call("echo", text=big))
    output = info["tool_calls"][0]["output"]
    assert output.startswith("xxxx") and "characters cut" in output and len(output) < 4100
    decoded = smollm2_tokenizer.decode(obs["tokens"].tolist(), skip_special_tokens=False)
    assert decoded == obs["text"]  # tokens and text agree after all of it


def test_markdown_code_of_any_shape_is_the_sandboxs_error():
    env = gsm8k(tools=["python"], tool_format="markdown", max_turns=3)
    env.reset(seed=0)
    for code, error in [("(" * 100000, "too many nested parentheses"),
                        ("print(1)\x00", "null bytes")]:  # fmt: skip
        _, reward, terminated, _, info = env.step(f"```python\n{code}\n```")
        assert (reward, terminated) == (0.0, False)
        assert error in info["tool_calls"][0]["output"]
        env.reset(seed=0)


def test_parsing_and_checking_never_raise_on_deep_or_huge_values():
    (deep,) = parse_tool_calls("<tool_call>" + "[" * 100000 + "</tool_call>")
    assert deep.name is None and DEEP in deep.error
    # The call's object and its arguments are two levels of the bound.
    (ok,) = parse_tool_calls(call("echo", text=nested(MAX_JSON_DEPTH - 2)))
    assert ok.error is None and ok.arguments["text"] == nested(MAX_JSON_DEPTH - 2)
    (over,) = parse_tool_calls(call("echo", text=nested(MAX_JSON_DEPTH - 1)))
    assert DEEP in over.error
    params = {"type": "object", "properties": {"text": {"type": "string"}}}
    assert (
        check_arguments(params, {"text": nested(100000)})
        == "argument 'text' must be string, got list [[[[...]]]]"
    )
    assert check_arguments(params, {"text": 10**5000}).endswith("<an int too long to print>")
    # A call made by hand, deeper than any parse gives: still a record, never an exception.
    deep = nested(100000)
    record = Toolbox([echo]).run(ToolCall("echo", {"text": deep}))
    assert not record.ok and "must be string, got list [[[[...]]]]" in record.output
    assert record.as_dict()["arguments"]["text"] is deep  # as given, not copied level by level


def test_one_hostile_call_in_a_vector_step_leaves_the_other_sub_envs_alone():
    envs = gym.make_vec("LLMChat-GSM8K-v0", num_envs=3, dataset=ROWS, shuffle=False, tools=[add])
    try:
        envs.reset(seed=0)
        assert [s["query"] for s in envs.unwrapped.items] == [r["question"] for r in ROWS]
        hostile = "<tool_call>" + "[" * 100000 + "</tool_call>"
        actions = [call("add", a=24, b=48), hostile, "<answer>18</answer>"]
        obs, rewards, terminated, truncated, info = envs.step(actions)
        assert rewards.tolist() == [0.0, 0.0, 1.0]
        assert terminated.tolist() == [False, False, True] and not truncated.any()
        assert obs["history"][0][-1] == {"role": "tool", "content": "72"}
        assert DEEP in obs["history"][1][-1]["content"]
        assert info["tool_calls"][0][0]["ok"] and not info["tool_calls"][1][0]["ok"]
        _, rewards, terminated, *_ = envs.step(["<answer>72</answer>", "<answer>21</answer>",
                                                "no"])  # fmt: skip
        assert rewards.tolist()[:2] == [1.0, 1.0] and terminated.tolist()[:2] == [True, True]
    finally:
        envs.close()


# -- TextArena moves -----------------------------------------------------------------------

HUGE_GUESS = "[" + "9" * 5000 + "]"  # int() of it raises ValueError in TextArena


def test_a_guess_textarena_cannot_read_is_an_invalid_move():
    env = gym.make("LLMChat-TextArena-v0", game="GuessTheNumber-v0")
    env.reset(seed=3)
    obs, reward, terminated, truncated, _ = env.step("[10]")
    obs, reward, terminated, truncated, info = env.step(HUGE_GUESS)
    assert (reward, terminated, truncated, info) == (0.0, False, False, {})
    warning = obs["history"][-1]["content"]
    assert "You attempted an invalid move" in warning
    assert "could not read the move (ValueError: Exceeds the limit (4300 digits)" in warning
    _, reward, terminated, _, info = env.step(HUGE_GUESS)  # past the allowance: the end
    assert terminated and info["invalid_move"] and info["outcome"] == "loss"
    # The penalty is the game's own for an invalid move: its partial credit after [10].
    same = gym.make("LLMChat-TextArena-v0", game="GuessTheNumber-v0")
    same.reset(seed=3)
    same.step("[10]")
    same.step("no brackets")
    _, own_reward, own_terminated, _, own_info = same.step("no brackets")
    assert own_terminated and own_info["invalid_move"]
    assert reward == own_reward == pytest.approx(1 - 2 / 19)


def test_an_unreadable_move_of_either_seat_is_that_seats_invalid_move():
    def opponent(observation):
        return "[4]" if "'[4]'" in observation.split("Available Moves")[-1] else "[8]"

    env = gym.make("LLMChat-TextArena-v0", game="TicTacToe-v0", opponent=opponent)
    env.reset(seed=0)
    obs, reward, terminated, _, _ = env.step(HUGE_GUESS)  # the learner's: warned, its turn
    assert (reward, terminated) == (0.0, False)
    assert "attempted an invalid move" in obs["history"][-1]["content"]
    _, reward, terminated, _, info = env.step("[0]")  # the game goes on as TextArena's
    assert (reward, terminated) == (0.0, False)
    # The opponent's unreadable moves: it is warned, then loses by TextArena's rules.
    env = gym.make("LLMChat-TextArena-v0", game="TicTacToe-v0", opponent=lambda _: HUGE_GUESS)
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step("[4]")
    assert (reward, terminated, info["outcome"]) == (1.0, True, "win")
    assert "could not read the move (ValueError" in info["reason"]


def test_a_vector_of_games_steps_past_one_unreadable_move():
    envs = make_textarena_vector_env(2, game="GuessTheNumber-v0")
    try:
        envs.reset(seed=0)
        obs, rewards, terminated, _, _ = envs.step([HUGE_GUESS, "[10]"])
        assert terminated.tolist() == [False, False] and rewards.tolist() == [0.0, 0.0]
        assert "invalid move" in obs["history"][0][-1]["content"]
        assert "The target number is" in obs["history"][1][-1]["content"]
    finally:
        envs.close()


# -- a Response's text and tokens ----------------------------------------------------------


@pytest.mark.parametrize("mode", ["history", "tokens"])
def test_a_response_whose_text_and_tokens_disagree_is_refused(mode, smollm2_tokenizer):
    tok = smollm2_tokenizer
    env = gym.make("LLMChat-GSM8K-v0", dataset=ROWS[2:], input_mode=mode, tokenizer=tok)
    env.reset(seed=0)
    zero = np.asarray(tok("0")["input_ids"])
    with pytest.raises(
        ValueError,
        match="Response.text does not match Response.tokens: from character 0 the text reads "
        "'<answer>18</answer>' but its 1 tokens decode to '0'",
    ):
        env.step(Response("<answer>18</answer>", zero))
    with pytest.raises(ValueError, match="Response.text does not match"):
        env.step({"text": "<answer>18</answer>", "tokens": zero})
    assert env.unwrapped.conversation.turns == 0  # nothing happened
    # The text the tokens decode to, with the closing special token or without: scored.
    end = tok.convert_tokens_to_ids("<|im_end|>")
    tokens = np.asarray([*tok("<answer>18</answer>")["input_ids"], end])
    for text in ("<answer>18</answer><|im_end|>", "<answer>18</answer>"):
        env.reset(seed=0)
        obs, reward, terminated, *_ = env.step(Response(text, tokens))
        assert (reward, terminated) == (1.0, True)


def test_a_vector_step_with_a_disagreeing_response_names_it_and_changes_nothing(
    smollm2_tokenizer,
):
    tok = smollm2_tokenizer
    envs = gym.make_vec("LLMChat-GSM8K-v0", num_envs=2, dataset=ROWS[:2], shuffle=False,
                        input_mode="tokens", tokenizer=tok)  # fmt: skip
    envs.reset(seed=0)
    before = envs.unwrapped.conversations
    good = np.asarray(tok("<answer>72</answer>")["input_ids"])
    with pytest.raises(ValueError, match="actions\\[1\\]: Response.text does not match"):
        envs.step([Response("<answer>72</answer>", good), Response("<answer>21</answer>", good)])
    after = envs.unwrapped.conversations
    assert all(a is b for a, b in zip(after, before, strict=True))  # nothing stored
    _, rewards, *_ = envs.step([Response("<answer>72</answer>", good), good])
    assert rewards.tolist()[0] == 1.0
    envs.close()


def test_without_a_tokenizer_the_env_cannot_check_and_takes_both():
    env = gym.make("LLMChat-GSM8K-v0", dataset=ROWS[2:])
    env.reset(seed=0)
    _, reward, *_ = env.step(Response("<answer>18</answer>", [5, 6]))
    assert reward == 1.0
