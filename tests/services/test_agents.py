"""Agent programs as a source of episodes (issue 40): the OpenAI-SDK agent of
``examples/calculator_agent.py`` played through the gateway, its failures recorded, and
trained with ``llm-gym train --agent``."""

import json
import sys
import threading
from pathlib import Path

import gymnasium as gym
import numpy as np
import openai
import pytest

import llm_gym  # noqa: F401  (registers the envs)
from llm_gym.agents import AgentEpisodes, load_agent
from llm_gym.cli import main
from llm_gym.episodes import Episode
from llm_gym.policies import TransformersPolicy
from llm_gym.rubrics import TaskScore

AGENT = "examples/calculator_agent.py:solve"
ROOT = Path(__file__).resolve().parents[2]


class Logged:
    """The policy's samples, each kept as it was returned (to compare with the records)."""

    def __init__(self, policy):
        self.policy, self.samples = policy, []

    @property
    def version(self):
        return self.policy.version

    def sample(self, prompts):
        samples = self.policy.sample(prompts)
        self.samples += samples
        return samples


@pytest.fixture(scope="module")
def policy(smol):
    model, tokenizer = smol
    kwargs = {"max_new_tokens": 24, "do_sample": True, "temperature": 1.0}
    return TransformersPolicy(model, tokenizer, input_mode="tokens", generate_kwargs=kwargs)


@pytest.fixture(scope="module")
def env():
    return gym.make(
        "LLMChat-ReasoningGym-v0", task="chain_sum", answer_format="last_number"
    ).unwrapped


def fixed(function):
    """``function`` as an agent whose calls ask for no settings (``Logged`` takes none)."""
    return function


def sdk_agent(base_url, api_key, item):
    """The calculator agent's loop without its per-call settings."""
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages = list(item["messages"])
    for _ in range(2):
        reply = client.chat.completions.create(model="policy", messages=messages)
        messages += [reply.choices[0].message, {"role": "user", "content": "Check it."}]
    return reply.choices[0].message.content


def test_recorded_tokens_are_the_samplers_and_the_mask_covers_only_them(policy, smol, env):
    logged = Logged(policy)
    with AgentEpisodes(sdk_agent, env, logged, smol[1], group_size=2, num_agents=4) as rollouts:
        episodes = rollouts.episodes(4)
        assert rollouts.gateway.recorder.names() == []  # every run's calls were taken
    assert all(isinstance(e, Episode) for e in episodes)
    records = [e.record() for e in episodes]
    assert [r["item_index"] for r in records] == [0, 1, 2, 3]
    assert list(records[0])[:2] == ["env_index", "item_index"] and "level" not in records[0]
    assert records[0]["prompt"] == records[1]["prompt"] != records[2]["prompt"]  # groups
    sampled = [s.tokens.tolist() for s in logged.samples]
    assert len(sampled) == 8 == sum(r["num_calls"] for r in records)
    for record in records:
        assert record["error"] is None and record["num_segments"] == 1
        first, second = record["calls"]
        assert first.tokens.tolist() in sampled and second.tokens.tolist() in sampled
        assert second.parent == first.index
        ids, mask = record["conversation_ids"], record["policy_mask"]
        assert ids[mask].tolist() == first.tokens.tolist() + second.tokens.tolist()
        assert np.array_equal(ids[: len(second.prompt_ids)], second.prompt_ids)
        log_probs = np.concatenate([first.log_probs, second.log_probs])
        assert np.array_equal(record["sampled_log_probs"], log_probs)
        # The reward is the task's of the agent's final answer.
        score = TaskScore(*env.reward(record["response"], record["item"]))
        assert (record["reward"], record["success"]) == (score.reward, score.info["success"])
        assert record["response"] == second.text


def test_the_calculator_agent_runs_its_tool_loop_through_the_gateway(policy, smol, env):
    agent = load_agent(str(ROOT / AGENT))
    with AgentEpisodes(agent, env, policy, smol[1], group_size=2, num_agents=2) as rollouts:
        records = [e.record() for e in rollouts.episodes(2)]
    for record in records:
        assert record["error"] is None, record["error"]
        assert record["num_segments"] == 1 and 1 <= record["num_calls"] <= 4
        first = record["calls"][0]
        # Its tools are listed in the system prompt of its first call.
        assert '"name": "calculate"' in smol[1].decode(first.prompt_ids)
    calculate = sys.modules[agent.__module__].calculate
    assert calculate(expression="2 + 3 * 4") == "14"
    assert calculate(expression="__import__('os')").startswith("error: ")  # never eval'd


def test_failures_are_recorded_and_the_others_go_on(policy, smol, env, tmp_path):
    def crashes(base_url, api_key, item):
        raise RuntimeError("the agent's bug")

    def never_calls(base_url, api_key, item):
        return "42"

    def returns_no_text(base_url, api_key, item):
        openai.OpenAI(base_url=base_url, api_key=api_key).chat.completions.create(
            model="policy", messages=item["messages"]
        )
        return None

    released = threading.Event()

    def hangs(base_url, api_key, item):
        released.wait(60)  # past the 1 s limit until the test lets it go
        return "1"

    expected = {
        crashes: "RuntimeError: the agent's bug",
        never_calls: "the agent made no model call",
        returns_no_text: "the agent must return its final answer as a str, got NoneType",
        hangs: "the agent ran past its time limit (1 s)",
    }
    for agent, error in expected.items():
        timeout = 1 if agent is hangs else 120
        with AgentEpisodes(agent, env, policy, smol[1], timeout=timeout) as rollouts:
            (record,) = [e.record() for e in rollouts.episodes(1)]
        assert (record["error"], record["reward"], record["success"]) == (error, 0.0, False)
        assert rollouts.gateway.recorder.names() == []
    released.set()
    # A command agent: its standard output is the answer; a failing one is recorded.
    script = tmp_path / "agent.py"
    script.write_text(
        "import json, os, openai\n"
        "item = json.loads(os.environ['LLM_GYM_ITEM'])\n"
        "client = openai.OpenAI()\n"
        "reply = client.chat.completions.create(model='policy', messages=item['messages'])\n"
        "print(reply.choices[0].message.content)\n"
    )
    with AgentEpisodes([sys.executable, str(script)], env, policy, smol[1]) as rollouts:
        (record,) = [e.record() for e in rollouts.episodes(1)]
    assert record["error"] is None and record["num_calls"] == 1
    assert record["response"] == record["calls"][0].text.strip()
    broken = [sys.executable, "-c", "import sys; sys.exit('no luck')"]
    with AgentEpisodes(broken, env, policy, smol[1]) as rollouts:
        (record,) = [e.record() for e in rollouts.episodes(1)]
    assert record["error"] == "the agent exited with status 1: no luck\n"


def test_a_run_past_its_time_has_its_later_calls_refused(policy, smol, env):
    seen, late, called = {}, threading.Event(), threading.Event()

    def slow(base_url, api_key, item):
        seen["key"] = api_key
        late.wait(60)  # calls only once its run is over
        client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        try:
            client.chat.completions.create(model="policy", messages=item["messages"])
        except openai.PermissionDeniedError as error:
            seen["refused"] = error.message
        finally:
            called.set()
        return "late"

    with AgentEpisodes(slow, env, policy, smol[1], timeout=0.5) as rollouts:
        (record,) = [e.record() for e in rollouts.episodes(1)]
        late.set()
        assert called.wait(60)  # a guard against a hang, far above the call's time
        assert "is over" in seen["refused"]
        assert rollouts.gateway.recorder.calls(seen["key"]) == []
    assert record["error"].startswith("the agent ran past its time limit")


def test_bad_arguments_name_themselves(policy, smol, env):
    with pytest.raises(TypeError, match="agent must be a callable"):
        AgentEpisodes(42, env, policy, smol[1])
    with pytest.raises(TypeError, match="task must be a Task or a task env"):
        AgentEpisodes(sdk_agent, "chain_sum", policy, smol[1])
    with AgentEpisodes(sdk_agent, env, policy, smol[1], group_size=2) as rollouts:
        with pytest.raises(ValueError, match="multiple of group_size=2, got 3"):
            rollouts.episodes(3)
    with pytest.raises(ValueError, match="'module:function'"):
        load_agent("no_colon")
    with pytest.raises(ValueError, match="has no function 'nope'"):
        load_agent("json:nope")


@pytest.mark.slow
def test_llm_gym_train_trains_the_agent(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "agent-run"
    code = main([
        "train", "--agent", AGENT, "--env-arg", "task=chain_sum", "--iterations", "2",
        "--groups", "1", "--group-size", "2", "--max-new-tokens", "24", "--eval-episodes", "2",
        "--num-agents", "2", "--out", str(out), "--no-progress",
    ])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["versions"] for row in rows] == [[0], [1]]  # the calls' policy versions
    for row in rows:
        assert row["agent_errors"] == 0 and row["calls_per_episode"] >= 1
        assert row["segments_per_episode"] == 1.0 and row["response_tokens"] > 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["agent"] == AGENT
    assert set(summary["before"]) >= {"success", "reward", "agent_errors"}
    assert "greedy success on held-out questions" in capsys.readouterr().out
    assert (out / "checkpoint-2").is_dir()


def test_train_refuses_agents_with_what_they_cannot_take(capsys):
    code = main(["train", "--agent", AGENT, "--async", "--out", "/tmp/never"])
    assert code == 2
    assert "--agent) is not supported with --async" in capsys.readouterr().err


def agents_sdk_agent(base_url, api_key, item):
    """An agent of the OpenAI Agents SDK (``openai-agents``), unmodified but for its model:
    chat completions at the gateway."""
    from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool

    @function_tool
    def add(a: int, b: int) -> int:
        """The sum of two integers."""
        return a + b

    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    agent = Agent(
        name="adder", instructions=item["messages"][0]["content"], tools=[add],
        model=OpenAIChatCompletionsModel(model="policy", openai_client=client),
    )  # fmt: skip
    result = Runner.run_sync(agent, item["query"], max_turns=3)
    return str(result.final_output)


def test_an_openai_agents_sdk_agent_plays_through_the_gateway(policy, smol, env):
    from agents import set_tracing_disabled

    set_tracing_disabled(True)  # no trace export: offline
    with AgentEpisodes(agents_sdk_agent, env, policy, smol[1], num_agents=2) as rollouts:
        records = [e.record() for e in rollouts.episodes(2)]
    for record in records:
        assert record["error"] is None, record["error"]
        assert record["num_calls"] >= 1 and record["num_tokens"] == record["policy_mask"].sum()
        first = record["calls"][0]
        prompt = smol[1].decode(first.prompt_ids)
        assert '"name": "add"' in prompt and record["item"]["query"] in prompt
        assert record["response"] == record["calls"][-1].text
