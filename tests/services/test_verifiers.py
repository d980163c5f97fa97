"""verifiers both ways (issue 39, item 4), with verifiers' real classes and rollouts:
llm_gym's envs as verifiers environments (``llm_gym.integrations.verifiers.load_environment``)
and verifiers environments as Gymnasium envs (``LLMChat-Verifiers-v0``). verifiers' own
evaluation against a vLLM server is in test_verifiers_eval.py."""

import asyncio
import json
import os
import subprocess
import sys
import time

import gymnasium as gym
import pytest
from datasets import Dataset
from gsm8k_fixture import FIXTURE

import llm_gym
from llm_gym.envs import SessionChatEnv, VectorHooks

vf = pytest.importorskip("verifiers")

from llm_gym.integrations.verifiers import load_environment  # noqa: E402

GSM8K = ("LLMChat-GSM8K-v0", {"data_dir": str(FIXTURE), "split": "test"})
GUESS = ("LLMChat-TextArena-v0", {"game": "GuessTheNumber-v0"})


def play(env, moves, **reset):
    """``moves`` in ``env`` from ``env.reset(**reset)`` until the end: the first history, the
    rewards, the last history, terminated, truncated and the last info (``env`` closed)."""
    observation, info = env.reset(**reset)
    rewards, first, terminated, truncated = [], list(observation["history"]), False, False
    for move in moves:
        observation, reward, terminated, truncated, info = env.step(move)
        rewards.append(reward)
        if terminated or truncated:
            break
    env.close()
    return first, rewards, list(observation["history"]), terminated, truncated, info


def in_process(gym_id, args, seed, moves):
    """``moves`` in ``gym.make(gym_id, **args)`` reset with ``seed`` (see ``play``)."""
    return play(gym.make(gym_id, **args), moves, seed=seed)[:5]


def play_row(environment, row, moves):
    """``moves`` through ``LLMChat-Verifiers-v0`` on ``row`` (see ``play``)."""
    env = gym.make("LLMChat-Verifiers-v0", environment=environment)
    return play(env, moves, options={"item": row})


def test_a_single_turn_env_is_a_verifiers_environment_with_its_rows_and_reward():
    gym_id, args = GSM8K
    environment = load_environment(gym_id, num_examples=3, seed=5, **args)
    assert isinstance(environment, vf.MultiTurnEnv)
    rows = environment.get_eval_dataset().to_list()
    assert [row["info"] for row in rows] == [{"gym_id": gym_id, "seed": s} for s in (5, 6, 7)]
    for row in rows:
        seed = row["info"]["seed"]
        first, *_ = in_process(gym_id, args, seed, [])
        assert [{"role": m["role"], "content": m["content"]} for m in row["prompt"]] == first
        answer = row["answer"].rsplit("####", 1)[1].strip()  # GSM8K's final number
        for move in (f"<answer>{answer}</answer>", "I do not know"):
            _, expected, *_ = in_process(gym_id, args, seed, [move])
            got_first, rewards, _, terminated, truncated, info = play_row(environment, row, [move])
            assert got_first == first
            assert rewards == expected and info["reward"] == expected[0]
            assert (terminated, truncated) == (True, False)
            assert info["metrics"]["env_reward"] == expected[0]
        assert expected == [0.0]  # the wrong answer; the right one earned 1.0 above
        _, right, *_ = in_process(gym_id, args, seed, [f"<answer>{answer}</answer>"])
        assert right == [1.0]


def test_a_game_is_a_multi_turn_environment_whose_turns_are_the_env_steps():
    gym_id, args = GUESS
    environment = load_environment(gym_id, num_examples=2, **args)
    row = environment.get_eval_dataset()[1]
    moves = ["[10]", "[5]", "[15]", "[12]", "[7]", "[18]", "[3]", "[1]", "[20]", "[11]"]
    first, expected, last, ended, cut = in_process(gym_id, args, 1, moves)
    got_first, rewards, got_last, terminated, truncated, info = play_row(environment, row, moves)
    assert got_first == first and len(rewards) == len(expected) > 1
    assert rewards[:-1] == [0.0] * (len(rewards) - 1)  # the rubric scores at the end
    assert rewards[-1] == pytest.approx(sum(expected))
    assert (terminated, truncated) == (ended, cut)
    # what the game said after each move is what verifiers' rollout sent the model next
    assert got_last[: len(last) - 1] == last[:-1] or got_last == last
    assert info["stop_condition"] == "has_final_env_response"


def test_verifiers_own_rollout_and_rubric_score_the_llm_gym_return():
    """No Gymnasium on verifiers' side: its ``rollout`` and ``Rubric`` with a client of its
    own kind (a ``vf.Client`` whose replies are fixed moves) give llm_gym's return."""
    gym_id, args = GUESS
    environment = load_environment(gym_id, num_examples=1, **args)
    row = environment.get_eval_dataset()[0]
    moves = ["[10]", "[15]", "[12]", "[13]", "[11]", "[14]", "[16]", "[17]", "[18]", "[19]"]

    class Moves(vf.Client):  # verifiers' own client interface, answering from a list
        def setup_client(self, config):
            return None

        async def to_native_tool(self, tool):
            return tool

        async def to_native_prompt(self, messages):
            return messages, {}

        async def get_native_response(self, prompt, model, sampling_args, tools=None, **kw):
            return self.client.pop(0)

        async def raise_from_native_response(self, response):
            return None

        async def from_native_response(self, text):
            message = vf.ResponseMessage(content=text, finish_reason="stop", is_truncated=False)
            return vf.Response(id="r", created=0, model="m", message=message)

        async def close(self):
            return None

    async def run():
        state = await environment.rollout(dict(row), Moves(list(moves)), "m")
        await environment.rubric.score_rollout(state)
        return state

    state = asyncio.run(run())
    _, expected, *_ = in_process(gym_id, args, 0, moves)
    assert state["reward"] == pytest.approx(sum(expected))
    assert len(state["trajectory"]) == len(expected)
    assert state.get("llm_gym_env") is None  # closed by the cleanup handler


def test_a_reply_the_env_refuses_ends_that_rollout_with_reward_zero():
    gym_id, args = GSM8K
    environment = load_environment(gym_id, num_examples=1, max_text_length=16, **args)
    row = environment.get_eval_dataset()[0]
    *_, terminated, truncated, info = play_row(environment, row, ["x" * 40])
    assert (info["reward"], terminated, truncated) == (0.0, True, False)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: load_environment("LLMChat-Nope-v0"), "Nope"),
        (lambda: load_environment(GSM8K[0], num_examples=0, **GSM8K[1]), "num_examples"),
        (lambda: load_environment(GSM8K[0], env_args=[1], **GSM8K[1]), "env_args"),
        (
            lambda: load_environment(GSM8K[0], input_mode="text", **GSM8K[1]),
            "tokenizer|history",
        ),
    ],
)
def test_bad_arguments_name_themselves(call, match):
    with pytest.raises(Exception, match=match):
        call()


def test_vf_load_environment_finds_it_by_module_name():
    environment = vf.load_environment(
        "llm_gym.integrations.verifiers", gym_id=GUESS[0], num_examples=1, **GUESS[1]
    )
    # what verifiers' env server loads again in its workers
    assert environment.env_id == "llm_gym.integrations.verifiers"
    assert environment.env_args == {"gym_id": GUESS[0], "num_examples": 1, **GUESS[1]}
    assert environment.get_eval_dataset()[0]["info"]["seed"] == 0


# -- verifiers environments as Gymnasium envs ----------------------------------------------


def legs(n=3):
    """verifiers' own ReasoningGymEnv (nobody here wrote it)."""
    return vf.ReasoningGymEnv(gym="leg_counting", num_train_examples=n, num_eval_examples=n)


def test_verifiers_reasoning_gym_env_plays_with_its_rows_and_its_rubric():
    environment = legs()
    rows = environment.get_eval_dataset().to_list()
    env = gym.make("LLMChat-Verifiers-v0", environment=environment)
    seen = set()
    for seed in range(3):
        observation, info = env.reset(seed=0) if seed == 0 else env.reset()
        row = next(r for r in rows if r["example_id"] == info["example_id"])
        expected = [{"role": m["role"], "content": m["content"]} for m in row["prompt"]]
        assert list(observation["history"]) == expected
        entry = environment.rg_dataset[int(row["answer"])]
        _, reward, terminated, truncated, step_info = env.step(
            f"<answer>{entry['answer']}</answer>"
        )
        assert (reward, terminated, truncated) == (1.0, True, False)
        assert step_info["metrics"]["check_answer_reward_func"] == 1.0
        observation, _ = env.reset(options={"item": row})
        _, reward, *_ = env.step("<answer>-1</answer>")
        assert reward == 0.0
        seen.add(info["example_id"])
    assert len(seen) == 3  # one epoch of the seeded order serves each row once
    with pytest.raises(gym.error.ResetNeeded):
        env.step("again")
    env.close()


class Echo(vf.MultiTurnEnv):
    """A verifiers multi-turn env: it answers each reply with its length, ending at "stop"."""

    async def env_response(self, messages, state):
        text = messages[-1].content if hasattr(messages[-1], "content") else messages[-1]["content"]
        if text == "stop":
            state["final_env_response"] = [{"role": "user", "content": "bye"}]
            return state["final_env_response"]
        if text == "slow":
            await asyncio.sleep(3)
        if text == "fail":
            raise vf.Error("the env failed")
        return [{"role": "user", "content": f"{len(text)} characters"}]


def echo(max_turns=5):
    dataset = Dataset.from_list([{"question": "talk", "answer": ""}])

    async def turns(state):
        return float(len(state["trajectory"]))

    return Echo(dataset=dataset, rubric=vf.Rubric(funcs=[turns]), max_turns=max_turns)


def test_a_multi_turn_verifiers_env_answers_each_step_and_its_rubric_scores_the_end():
    env = gym.make("LLMChat-Verifiers-v0", environment=echo())
    observation, _ = env.reset(seed=0)
    assert list(observation["history"]) == [{"role": "user", "content": "talk"}]
    observation, reward, terminated, truncated, _ = env.step("hello")
    assert list(observation["history"])[-2:] == [
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "5 characters"},
    ]
    assert (reward, terminated, truncated) == (0.0, False, False)
    observation, reward, terminated, truncated, info = env.step("stop")
    assert (reward, terminated, truncated) == (2.0, True, False)  # its rubric: 2 turns
    assert list(observation["history"])[-1] == {"role": "user", "content": "bye"}
    # its max_turns is a cut
    env = gym.make("LLMChat-Verifiers-v0", environment=echo(max_turns=2))
    env.reset(seed=0)
    env.step("a")
    _, reward, terminated, truncated, info = env.step("b")
    assert (reward, terminated, truncated, info["stop_condition"]) == (
        2.0,
        False,
        True,
        "max_turns_reached",
    )


def test_a_slow_or_failing_verifiers_env_ends_its_episode_not_the_caller():
    env = gym.make("LLMChat-Verifiers-v0", environment=echo(), turn_timeout_s=0.5)
    env.reset(seed=0)
    started = time.monotonic()
    _, reward, terminated, truncated, info = env.step("slow")
    assert time.monotonic() - started < 2.5
    assert (reward, terminated, truncated) == (0.0, False, True)
    assert "turn_timeout_s=0.5" in info["error"]
    env.reset(seed=0)  # a new rollout: the old one was cancelled
    _, _, terminated, truncated, info = env.step("fail")
    assert info["stop_condition"] == "has_error" and "the env failed" in info["error"]
    assert (terminated, truncated) == (True, False)
    observation, _ = env.reset(seed=0)
    assert list(observation["history"]) == [{"role": "user", "content": "talk"}]


def test_a_verifiers_tool_env_gets_hermes_calls_as_tool_calls():
    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: the first.
            b: the second.
        """
        return a + b

    async def used_tool(state):
        return float(any(m.get("role") == "tool" for m in map(dict, state["completion"])))

    dataset = Dataset.from_list([{"question": "What is 2 + 3?", "answer": "5"}])
    tools = vf.ToolEnv(dataset=dataset, tools=[add], rubric=vf.Rubric(funcs=[used_tool]))
    env = gym.make("LLMChat-Verifiers-v0", environment=tools)
    observation, _ = env.reset(seed=0)
    system = list(observation["history"])[0]
    assert system["role"] == "system" and '"name": "add"' in system["content"]
    call = json.dumps({"name": "add", "arguments": {"a": 2, "b": 3}})
    observation, reward, terminated, _, _ = env.step(f"<tool_call>{call}</tool_call>")
    assert list(observation["history"])[-1] == {"role": "tool", "content": "5"}
    assert not terminated
    _, reward, terminated, truncated, _ = env.step("It is 5.")
    assert (reward, terminated, truncated) == (1.0, True, False)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"environment": 42}, TypeError, "environment must be a verifiers Environment.*int"),
        ({"environment": legs(1), "split": "test"}, ValueError, "split"),
        ({"environment": legs(1), "turn_timeout_s": 0}, ValueError, "turn_timeout_s"),
        ({"environment": legs(1), "system_prompt": "x"}, TypeError, "own system_prompt"),
        ({"environment": legs(1), "env_args": {"a": 1}}, TypeError, "env_args"),
        ({"environment": "no_such_verifiers_env"}, ValueError, "no_such_verifiers_env"),
    ],
)
def test_bad_env_arguments_name_themselves(kwargs, error, match):
    with pytest.raises(error, match=match):
        gym.make("LLMChat-Verifiers-v0", **kwargs)


def test_a_vector_env_of_verifiers_rollouts_shards_the_rows_and_resets_in_the_same_step():
    environment = legs(4)
    envs = gym.make_vec("LLMChat-Verifiers-v0", num_envs=2, environment=environment)
    assert [env.unwrapped.shard for env in envs.envs] == [(0, 2), (1, 2)]
    assert all(isinstance(env.unwrapped, SessionChatEnv) for env in envs.envs)
    assert all(isinstance(env.unwrapped, VectorHooks) for env in envs.envs)
    _, infos = envs.reset(seed=0)
    first = list(infos["example_id"])
    assert len(set(first)) == 2  # each sub-env on its own shard of the rows
    answers = [environment.rg_dataset[int(a)]["answer"] for a in infos["item_answer"]]
    moves = [f"<answer>{answers[0]}</answer>", "<answer>-1</answer>"]
    _, rewards, terminated, _, infos = envs.step(moves)
    assert list(rewards) == [1.0, 0.0] and list(terminated) == [True, True]
    assert set(infos["example_id"]).isdisjoint(first)  # the next rows, in the same step
    envs.close()


@pytest.mark.slow
def test_llm_gym_rollout_plays_a_verifiers_environment(model_dirs, tmp_path):
    """``llm-gym rollout`` on LLMChat-Verifiers-v0 whose environment is llm_gym's own GSM8K
    loaded through verifiers: the whole round trip from the command."""
    gym_args = {"gym_id": GSM8K[0], **GSM8K[1], "num_examples": 3}
    command = [sys.executable, "-m", "llm_gym", "rollout", "--env", "LLMChat-Verifiers-v0"]
    command += ["--env-arg", "environment=llm_gym.integrations.verifiers"]
    command += ["--env-arg", f"env_args={json.dumps(gym_args)}", "--model", model_dirs[0]]
    command += ["--num-envs", "2", "--episodes", "3", "--max-new-tokens", "8"]
    command += ["--out", str(tmp_path), "--threads", "1", "--no-progress"]
    environment = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = (tmp_path / "episodes.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert len(records) == 3 and len({r["example_id"] for r in records}) == 3
    for record in records:
        # row i of load_environment is the episode of seed i: replay the reply in-process
        (reply,) = record["responses"]
        _, expected, *_ = in_process(GSM8K[0], GSM8K[1], record["example_id"], [reply])
        assert record["reward"] == expected[0] == record["metrics"]["env_reward"]
        assert record["stop_condition"] == "has_final_env_response"


def test_a_verifiers_rollout_refuses_to_fork_in_one_line():
    gym_id, args = GUESS
    environment = load_environment(gym_id, num_examples=1, seed=0, **args)
    env = gym.make("LLMChat-Verifiers-v0", environment=environment)
    try:
        env.reset(options={"item": environment.get_eval_dataset().to_list()[0]})
        with pytest.raises(llm_gym.ForkError) as refused:
            llm_gym.fork(env)
        assert str(refused.value) == (
            "VerifiersChatEnv cannot fork: its episode is a verifiers rollout running in its "
            "own task, whose state verifiers offers no way to copy"
        )
    finally:
        env.close()
