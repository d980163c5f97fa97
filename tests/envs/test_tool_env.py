"""Multi-turn tool episodes on the chat tasks: scripted policies, bad calls, token prefixes,
vector envs."""

import json
import threading

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from gymnasium.vector import SyncVectorEnv
from mcp_fixture import mcp_server_command

import llm_gym  # noqa: F401  (registers the ids)
from llm_gym.chat import Response, TokenPrefixError
from llm_gym.envs import sharded_env_fns
from llm_gym.tools import MCPTools, Tool

ROWS = [
    {"question": "Half of 48, plus 48?", "answer": "48 / 2 = 24\n24 + 48 = 72\n#### 72"},
    {"question": "Three times 7?", "answer": "3 * 7 = 21\n#### 21"},
]
ANSWER = "<think>the tool said 72</think><answer>72</answer>"


def call(name, **arguments):
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


MEETING = threading.Barrier(8)  # the vector env's 8 sub-envs' calls, all running at once


def meet(label: str) -> str:
    """Wait until all eight calls are running at the same time, then say so.

    Args:
        label: Who calls.
    """
    try:  # one by one, the first call would wait alone: 60 s only guards against a hang
        MEETING.wait(timeout=60)
    except threading.BrokenBarrierError:
        return f"{label} waited alone"
    return "done"


def gsm8k(**kwargs):
    kwargs.setdefault("dataset", ROWS)
    kwargs.setdefault("shuffle", False)
    return gym.make("LLMChat-GSM8K-v0", **kwargs)


def full_reward():
    env = gsm8k()
    env.reset(seed=0)
    _, reward, terminated, *_ = env.step(ANSWER)
    assert terminated
    return reward


def test_gsm8k_episode_with_the_python_tool_earns_the_full_reward():
    env = gsm8k(tools=["python"])
    obs, _ = env.reset(seed=0)
    system = obs["history"][0]["content"]
    assert "<answer>" in system and '"name": "python"' in system and "<tool_call>" in system
    obs, reward, terminated, truncated, info = env.step(call("python", code="print(48 / 2 + 48)"))
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert [m["role"] for m in obs["history"]] == ["system", "user", "assistant", "tool"]
    assert obs["history"][-1]["content"] == "72.0\n"
    (record,) = info["tool_calls"]
    assert record["name"] == "python" and record["ok"] and record["output"] == "72.0\n"
    assert record["arguments"] == {"code": "print(48 / 2 + 48)"} and record["seconds"] > 0
    assert (info["num_tool_calls"], info["failed_tool_calls"]) == (1, 0)
    obs, reward, terminated, truncated, info = env.step(ANSWER)
    assert (reward, terminated, truncated) == (full_reward(), True, False)
    assert reward == 1.0 and info["success"] and info["tool_calls"] == []
    assert info["num_tool_calls"] == 1


def test_a_plain_function_and_an_mcp_server_serve_the_same_episode(tmp_path):
    server = MCPTools(command=mcp_server_command(tmp_path))
    for tools in ([add], [server]):
        env = gsm8k(tools=tools)
        env.reset(seed=0)
        obs, reward, terminated, _, info = env.step(call("add", a=24, b=48))
        assert obs["history"][-1] == {"role": "tool", "content": "72"}
        assert info["tool_calls"][0]["ok"] and (reward, terminated) == (0.0, False)
        _, reward, terminated, _, info = env.step(ANSWER)
        assert (reward, terminated, info["success"]) == (1.0, True, True)
        env.close()
    assert not server.running  # env.close() shut the server down


@pytest.mark.parametrize(
    ("action", "message"),
    [
        ("<tool_call>{not json}</tool_call>", "Error: the call is not valid JSON"),
        (call("nope", x=1), "Error: unknown tool 'nope'; the tools are ['add', 'explode']"),
        (call("add", a=1), "Error: add: missing required arguments ['b']"),
        (call("add", a=1, b="2"), "Error: add: argument 'b' must be integer, got str '2'"),
        (call("explode", reason="x"), "Error: explode raised RuntimeError: boom: x"),
        ('<tool_call>{"name": "add"', "Error: the <tool_call> tag is not closed"),
    ],
)
def test_every_bad_call_is_a_tool_message_and_changes_nothing_else(action, message):
    env = gsm8k(tools=[add, Tool.from_function(explode)])
    obs, _ = env.reset(seed=0)
    before = obs["history"]
    obs, reward, terminated, truncated, info = env.step(action)
    assert obs["history"][: len(before)] == before
    assert obs["history"][-2] == {"role": "assistant", "content": action}
    assert obs["history"][-1]["role"] == "tool"
    assert obs["history"][-1]["content"].startswith(message)
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert (info["num_tool_calls"], info["failed_tool_calls"]) == (1, 1)
    assert not info["tool_calls"][0]["ok"]
    _, reward, terminated, _, _ = env.step(ANSWER)  # the episode goes on as before
    assert (reward, terminated) == (1.0, True)


def explode(reason: str) -> str:
    """Raise.

    Args:
        reason: Why.
    """
    raise RuntimeError(f"boom: {reason}")


def test_calls_past_max_tool_calls_truncate_the_episode():
    env = gsm8k(tools=[add], max_tool_calls=3)
    env.reset(seed=0)
    _, _, terminated, truncated, info = env.step(call("add", a=1, b=1) + call("add", a=2, b=2))
    assert (terminated, truncated, info["num_tool_calls"]) == (False, False, 2)
    obs, reward, terminated, truncated, info = env.step(
        call("add", a=3, b=3) + call("add", a=4, b=4)
    )
    assert (reward, terminated, truncated) == (0.0, False, True)
    assert [r["output"] for r in info["tool_calls"]] == ["6"]  # the 4th call did not run
    assert info["num_tool_calls"] == 3
    with pytest.raises(gym.error.ResetNeeded):
        env.step(ANSWER)


def test_markdown_blocks_run_with_the_python_tool():
    env = gsm8k(tools=["python"], tool_format="markdown")
    obs, _ = env.reset(seed=0)
    assert "```python" in obs["history"][0]["content"]
    obs, reward, _, _, info = env.step("Let me run it:\n```python\nprint(48 / 2 + 48)\n```")
    assert obs["history"][-1] == {"role": "tool", "content": "72.0\n"} and reward == 0.0
    assert env.step(ANSWER)[1] == 1.0


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"tools": "python"}, TypeError, "tools must be a list"),
        (
            {"tools": ["python"], "max_tool_calls": 0},
            ValueError,
            "max_tool_calls must be an int >= 1",
        ),
        ({"tools": ["python"], "tool_format": "xml"}, ValueError, "tool_format must be one of"),
        ({"observation_keys": ("policy_mask",)}, ValueError, "marks tokens: add 'tokens'"),
    ],
)
def test_bad_tool_arguments_name_themselves(kwargs, error, message):
    with pytest.raises(error, match=message):
        gsm8k(**kwargs)


def test_tokens_keep_the_prefix_over_a_three_turn_episode(smollm2_tokenizer):
    tok = smollm2_tokenizer
    env = gsm8k(tools=[add], input_mode="tokens", tokenizer=tok)
    obs, _ = env.reset(seed=0)
    assert set(obs) == {"tokens", "policy_mask"} and not obs["policy_mask"].any()
    end = tok.convert_tokens_to_ids("<|im_end|>")
    sampled_so_far = []
    for turn, text in enumerate([call("add", a=20, b=4), call("add", a=24, b=48), ANSWER]):
        # Sampled tokens that a re-tokenization of the text would not give back: the call
        # spelled character by character.
        rest = tok(text[3:], add_special_tokens=False)["input_ids"]
        sampled = np.array([*(tok.convert_tokens_to_ids(c) for c in text[:3]), *rest, end])
        assert not np.array_equal(sampled[:-1], tok(text, add_special_tokens=False)["input_ids"])
        previous = obs["tokens"]
        action = Response(tok.decode(sampled.tolist()), sampled)
        obs, reward, terminated, truncated, info = env.step(action)
        tokens, mask = obs["tokens"], obs["policy_mask"].astype(bool)
        assert np.array_equal(tokens[: len(previous)], previous)
        assert np.array_equal(tokens[len(previous) : len(previous) + len(sampled)], sampled)
        sampled_so_far.append(sampled)
        assert np.array_equal(tokens[mask], np.concatenate(sampled_so_far))
        assert obs["policy_mask"].shape == tokens.shape
        if turn < 2:
            assert tok.decode(tokens[len(previous) + len(sampled) :].tolist()).startswith(
                "\n<|im_start|>tool\n"
            )
    assert (reward, terminated) == (1.0, True)


def test_a_broken_token_prefix_fails_loudly_naming_turn_and_position(smollm2_tokenizer):
    # A template that drops earlier assistant turns' text (as reasoning templates drop
    # thinking) cannot keep the sampled tokens: the env must say so, not train on a lie.
    rewrite = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
        "{% if m['role'] == 'assistant' and not loop.last %}(hidden){% else %}"
        "{{ m['content'] }}{% endif %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    tok = smollm2_tokenizer
    env = gsm8k(tools=[add], input_mode="tokens", tokenizer=tok,
                template_kwargs={"chat_template": rewrite})  # fmt: skip
    obs, _ = env.reset(seed=0)
    text = call("add", a=1, b=2)
    sampled = np.array(tok(text, add_special_tokens=False)["input_ids"])
    with pytest.raises(TokenPrefixError, match=r"turn 1: position \d+ holds token"):
        env.step(Response(text, sampled))
    assert np.array_equal(env.unwrapped.conversation.tokens, obs["tokens"])  # nothing changed


def test_check_env_passes_with_tools(smollm2_tokenizer):
    for kwargs in ({}, {"input_mode": "tokens", "tokenizer": smollm2_tokenizer}):
        env = gsm8k(tools=["python", add], **kwargs)
        check_env(env.unwrapped, skip_render_check=True)


@pytest.mark.parametrize("mode", ["vector_entry_point", "sync", "async"])
def test_make_vec_runs_tool_episodes(mode):
    kwargs = {"dataset": ROWS, "shuffle": False, "tools": [add]}
    if mode == "vector_entry_point":
        envs = gym.make_vec("LLMChat-GSM8K-v0", num_envs=2, vectorization_mode=mode, **kwargs)
    else:
        fns = sharded_env_fns("LLMChat-GSM8K-v0", 2, **kwargs)
        same_step = gym.vector.AutoresetMode.SAME_STEP  # as the native vector env
        envs = (
            SyncVectorEnv(fns, autoreset_mode=same_step)
            if mode == "sync"
            else gym.vector.AsyncVectorEnv(fns, shared_memory=False, autoreset_mode=same_step)
        )
    try:
        envs.reset(seed=0)
        obs, rewards, terminated, _, info = envs.step([call("add", a=24, b=48), ANSWER])
        assert obs["history"][0][-1] == {"role": "tool", "content": "72"}
        # Sub-env 1 holds question 1 (21): 72 is a wrong answer there, well formed.
        assert terminated.tolist() == [False, True] and rewards.tolist() == [0.0, 0.1]
        _, rewards, terminated, _, info = envs.step([ANSWER, ANSWER])
        assert terminated.tolist() == [True, True]
        assert rewards[0] == 1.0  # 72 is question 0's answer
        assert info["final_info"]["num_tool_calls"].tolist() == [1, 0]
    finally:
        envs.close()


def test_the_vector_env_runs_sub_envs_tool_calls_concurrently():
    MEETING.reset()
    envs = gym.make_vec("LLMChat-GSM8K-v0", num_envs=8, dataset=ROWS, tools=[meet])
    envs.reset(seed=0)
    # Each call returns only once all eight are running: they ran side by side.
    _, _, _, _, info = envs.step([call("meet", label=f"sub-env {i}") for i in range(8)])
    assert [records[0]["output"] for records in info["tool_calls"]] == ["done"] * 8
    envs.close()


@pytest.mark.parametrize("vector", [False, True])
def test_each_failed_call_pays_the_tool_error_reward_on_its_own_turn(vector):
    # Two bad calls and one good in a turn: that turn pays 2 x -0.25; the answer after it pays
    # the task's reward alone, in the native vector env as in the single env.
    action = call("add", a=1) + call("add", a=24, b=48) + call("nope")
    options = {"tools": [add], "tool_error_reward": -0.25}
    if vector:
        env = gym.make_vec("LLMChat-GSM8K-v0", num_envs=2, dataset=ROWS, shuffle=False, **options)
        env.reset(seed=0)
        answer_21 = ANSWER.replace("72", "21")  # the second sub-env's question
        _, rewards, terminated, _, info = env.step([action, answer_21])
        assert rewards.tolist() == [-0.5, 1.0] and terminated.tolist() == [False, True]
        assert info["failed_tool_calls"].tolist() == [2, 0]
        _, rewards, *_ = env.step([ANSWER, ANSWER])
        assert rewards[0] == 1.0
    else:
        env = gsm8k(**options)
        env.reset(seed=0)
        _, reward, terminated, _, info = env.step(action)
        assert (reward, terminated, info["failed_tool_calls"]) == (-0.5, False, 2)
        _, reward, terminated, *_ = env.step(ANSWER)
        assert (reward, terminated) == (1.0, True)
    with pytest.raises(TypeError, match="tool_error_reward must be an int or float, got str"):
        gsm8k(tools=[add], tool_error_reward="-0.1")
