"""The gateway over vLLM (issue 40, item 4): the OpenAI-SDK agent's calls go through the
gateway to a real vLLM server (fp32 on the CPU, the default model), and every recorded call
holds exactly the ids and log-probs vLLM returned for that prompt. Deselect with
``-m "not vllm"``; CI runs them."""

import copy

import gymnasium as gym
import numpy as np
import openai
import pytest

import llm_gym  # noqa: F401  (registers the envs)
from llm_gym.agents import AgentEpisodes, Gateway

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def served(vllm_default):
    """The test run's vLLM server of the default model, with this module's settings."""
    return vllm_default.with_settings(max_new_tokens=16, temperature=1.0, seed=0)


def check_agent(base_url, api_key, item):
    """examples/check_agent.py's loop, greedy: two calls of one conversation."""
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages = list(item["messages"])
    for _ in range(2):
        reply = client.chat.completions.create(model="policy", messages=messages, temperature=0)
        messages += [reply.choices[0].message, {"role": "user", "content": "Check it."}]
    return reply.choices[0].message.content


def test_the_agent_through_the_gateway_records_what_vllm_returned(served, smollm2_tokenizer):
    env = gym.make(
        "LLMChat-ReasoningGym-v0", task="chain_sum", answer_format="last_number"
    ).unwrapped
    with AgentEpisodes(
        check_agent, env, served, smollm2_tokenizer, group_size=2, num_agents=4
    ) as rollouts:
        records = [e.record() for e in rollouts.episodes(4)]
    greedy = copy.copy(served)
    greedy.temperature, greedy.seed = 0.0, None
    for record in records:
        assert record["error"] is None and record["num_segments"] == 1
        first, second = record["calls"]
        assert second.parent == first.index
        # What vLLM returns for the same prompts, asked directly: the same ids, log-probs
        # within the fp32 tolerance of two forwards.
        direct = greedy.sample([first.prompt_ids, second.prompt_ids])
        for call, sample in zip((first, second), direct, strict=True):
            assert np.array_equal(call.tokens, sample.tokens)
            np.testing.assert_allclose(call.log_probs, sample.log_probs, atol=1e-3)
        mask = record["policy_mask"]
        assert record["conversation_ids"][mask].tolist() == [
            *first.tokens.tolist(), *second.tokens.tolist(),
        ]  # fmt: skip
    assert records[0]["calls"][0].tokens.tolist() == records[1]["calls"][0].tokens.tolist()


def test_a_request_seed_and_n_reach_vllm(served, smollm2_tokenizer):
    with Gateway(served, smollm2_tokenizer, model_name="policy") as gateway:
        client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="seeded", max_retries=0)
        messages = [{"role": "user", "content": "Name a colour."}]
        one = client.chat.completions.create(model="policy", messages=messages, n=3, seed=11)
        two = client.chat.completions.create(model="policy", messages=messages, n=3, seed=11)
        assert [c.message.content for c in one.choices] == [c.message.content for c in two.choices]
        assert len({c.message.content for c in one.choices}) > 1  # three draws, not one
        calls = gateway.recorder.calls("seeded")
        assert len(calls) == 6 and all(c.version == 0 for c in calls)


def test_llm_gym_train_trains_the_agent_through_vllm(tmp_path, monkeypatch, capsys):
    import json
    from pathlib import Path

    from llm_gym.cli import main

    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    out = tmp_path / "agent-vllm"
    code = main([
        "train", "--agent", "examples/check_agent.py:solve", "--backend", "vllm",
        "--backend-arg", "max_model_len=2048", "--env-arg", "task=chain_sum",
        "--iterations", "2", "--groups", "1", "--group-size", "2", "--max-new-tokens", "16",
        "--eval-episodes", "0", "--out", str(out), "--no-progress",
    ])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    # The calls of iteration k were sampled by the server holding update k's weights.
    assert [row["versions"] for row in rows] == [[0], [1]]
    assert all(row["agent_errors"] == 0 and row["calls_per_episode"] == 2 for row in rows)
    assert all(row["segments_per_episode"] == 1.0 for row in rows)
    assert rows[1]["sync_seconds"] > 0  # the update was loaded into the server
