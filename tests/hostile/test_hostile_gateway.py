"""The gateway against a hostile caller (issue 53): real uvicorn on loopback, the official
``openai`` SDK and raw httpx. One caller must never stall, crash, read or write another's
episode, and every bad request is a 4xx in OpenAI's error shape naming the parameter."""

import json
import re
import signal
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import openai
import pytest
from gateway_fixture import QUESTION, client, gateway, policy  # noqa: F401  (fixtures)

from llm_gym.agents import Gateway
from llm_gym.agents.recording import Recorder
from llm_gym.policies import TransformersPolicy


def post(gateway, path, body, key="hostile", **options):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    return httpx.post(f"{gateway.url}/v1/{path}", content=content, headers=headers, **options)


def error_of(reply):
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    return error


def test_a_huge_request_neither_starves_another_agent_nor_runs_on_once_its_client_left(
    gateway,
):
    # max_tokens 1e9 was accepted and sampled to the end while every other call waited (no
    # reply in 150 s); it is capped at the context, sampled in turns, and dropped once its
    # client hangs up.
    count = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"  # greedy counting goes on: no end-of-text
    huge = {"model": "policy", "prompt": count, "max_tokens": 10**9, "temperature": 0}

    def give_up():
        with pytest.raises(httpx.ReadTimeout):
            post(gateway, "completions", huge, key="huge", timeout=4)

    thread = threading.Thread(target=give_up)
    thread.start()
    time.sleep(1.5)  # the huge request is being sampled
    reply = client(gateway, "second", timeout=30).completions.create(
        model="policy", prompt="1 + 1 =", max_tokens=2
    )
    assert reply.usage.completion_tokens <= 2
    thread.join()
    for _ in range(120):  # the hung-up request is dropped at its next turn
        if gateway.cancelled:
            break
        time.sleep(0.25)
    assert gateway.cancelled == 1
    assert gateway.recorder.calls("huge") == []  # never recorded


def test_context_limits_on_a_tiny_model(tiny_gpt2):
    # A 1,024-position model: max_tokens 1e9 was an IndexError (500).
    model, tokenizer = tiny_gpt2
    tiny_policy = TransformersPolicy(
        model, tokenizer, input_mode="tokens", generate_kwargs={"max_new_tokens": 4}
    )
    with Gateway(tiny_policy, tokenizer, model_name="policy") as gateway:
        prompt = [100] * 1010
        reply = client(gateway, "tiny", timeout=60).completions.create(
            model="policy", prompt=prompt, max_tokens=10**9, temperature=0
        )
        assert reply.usage.completion_tokens + reply.usage.prompt_tokens <= 1024
        assert reply.choices[0].finish_reason in ("length", "stop")
        (call,) = gateway.recorder.calls("tiny")
        assert len(call.tokens) == reply.usage.completion_tokens
        with pytest.raises(openai.BadRequestError) as error:
            client(gateway).completions.create(model="policy", prompt=[100] * 1024)
        body = error.value.body
        assert (body["code"], body["param"]) == ("context_length_exceeded", "prompt")
        assert "maximum context length is 1024 tokens" in body["message"]
        assert "resulted in 1024 tokens" in body["message"]
        assert gateway.context_length == 1024  # the model's max_position_embeddings


def test_a_message_longer_than_the_context_is_a_400_not_minutes_of_sampling(gateway):
    # 100 KB (16,676 tokens for an 8,192-token model) was sampled for 284 s; 5 MB was a 500.
    chat = client(gateway, "long", timeout=30).chat.completions
    with pytest.raises(openai.BadRequestError) as error:
        chat.create(model="policy", messages=[{"role": "user", "content": "word " * 20_000}])
    body = error.value.body
    assert (body["code"], body["param"]) == ("context_length_exceeded", "messages")
    assert re.search(r"maximum context length is 8192 tokens\. However, your messages "
                     r"resulted in \d{5} tokens", body["message"])  # fmt: skip
    with pytest.raises(openai.BadRequestError) as error:  # refused before it is tokenized
        chat.create(model="policy", messages=[{"role": "user", "content": "x" * 5_000_000}])
    assert error.value.body["code"] == "context_length_exceeded"
    assert "at least" in error.value.body["message"]
    assert gateway.recorder.calls("long") == []


def test_a_body_over_the_limit_is_a_413_before_it_is_parsed(policy, smol):
    with Gateway(policy, smol[1], model_name="policy", max_body_bytes=2**20) as small:
        body = {"model": "policy", "prompt": "x" * (2**20 + 10)}
        reply = post(small, "completions", body, timeout=30)
        assert reply.status_code == 413
        error = error_of(reply)
        assert error["code"] == "request_too_large" and "1,048,576" in error["message"]
        junk = b"{" * (3 * 2**20)  # not even JSON: never parsed
        assert post(small, "chat/completions", junk, timeout=30).status_code == 413
        ok = client(small).completions.create(model="policy", prompt="Hi", max_tokens=1)
        assert ok.usage.completion_tokens == 1
    assert Gateway(policy, smol[1]).max_body_bytes == 8 * 2**20


def test_an_episode_belongs_to_the_key_that_opened_it(gateway):
    client(gateway, "victim-key").chat.completions.create(
        model="policy", messages=QUESTION, max_tokens=2
    )
    url = f"{gateway.url}/v1/episodes/victim-key"
    attacker = {"Authorization": "Bearer attacker-key"}
    for headers in (attacker, {}):  # another key, or none, reads nothing and deletes nothing
        assert httpx.get(url, headers=headers).status_code == 404
        assert httpx.delete(url, headers=headers).status_code == 404
    hijack = client(gateway, "attacker-key").with_options(
        default_headers={"X-Episode-Id": "victim-key"}
    )
    with pytest.raises(openai.NotFoundError) as error:
        hijack.chat.completions.create(model="policy", messages=QUESTION, max_tokens=2)
    assert error.value.body["code"] == "episode_not_found"
    assert len(gateway.recorder.calls("victim-key")) == 1  # nothing written, nothing erased
    mine = httpx.get(url, headers={"Authorization": "Bearer victim-key"})
    assert mine.status_code == 200 and len(mine.json()["calls"]) == 1
    admin = httpx.get(url, headers={"Authorization": f"Bearer {gateway.admin_key}"})
    assert admin.status_code == 200
    # A name squatted before its key's first call is not the squatter's once the key calls.
    squat = client(gateway, "attacker-key").with_options(
        default_headers={"X-Episode-Id": "late-key"}
    )
    squat.chat.completions.create(model="policy", messages=QUESTION, max_tokens=2)
    client(gateway, "late-key").chat.completions.create(
        model="policy", messages=QUESTION, max_tokens=2
    )
    (call,) = gateway.recorder.calls("late-key")
    assert gateway.recorder.owner("late-key") == "late-key" and call.index == 0
    late = f"{gateway.url}/v1/episodes/late-key"
    assert httpx.get(late, headers=attacker).status_code == 404


def test_an_api_key_is_required_when_given(policy, smol):
    with Gateway(policy, smol[1], model_name="policy", api_key="sekret") as guarded:
        for key in ("wrong", "victim"):
            with pytest.raises(openai.AuthenticationError) as error:
                client(guarded, key).models.list()
            assert error.value.body["code"] == "invalid_api_key"
        reply = httpx.get(f"{guarded.url}/v1/episodes/x")
        assert reply.status_code == 401 and error_of(reply)["code"] == "invalid_api_key"
        assert client(guarded, "sekret").models.list().data[0].id == "policy"
        issued = guarded.issue_key()  # an agent's own key, owning its episodes
        client(guarded, issued).chat.completions.create(
            model="policy", messages=QUESTION, max_tokens=1
        )
        assert guarded.recorder.owner(issued) == issued
        guarded.revoke_key(issued)
        with pytest.raises(openai.AuthenticationError):
            client(guarded, issued).models.list()


def test_binding_beyond_loopback_without_a_key_prints_the_warning():
    process = subprocess.Popen(
        [sys.executable, "-m", "llm_gym", "gateway", "--host", "0.0.0.0", "--port", "0",
         "--max-new-tokens", "2", "--threads", "1", "--max-body-bytes", "1000",
         "--episode-ttl", "60", "--max-episodes", "2", "--chunk-tokens", "8"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        line = process.stdout.readline()
        found = re.search(r"serving 'policy' at http://0\.0\.0\.0:(\d+)/v1", line)
        assert found, line
        url = f"http://127.0.0.1:{found.group(1)}/v1/completions"
        body = {"model": "policy", "prompt": "x" * 1000}
        assert httpx.post(url, json=body, timeout=30).status_code == 413  # --max-body-bytes
    finally:
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    assert (
        "warning: serving on 0.0.0.0 without --api-key: anyone who reaches this port can "
        "call it" in err
    )


def deep(depth):
    return "[" * depth + "]" * depth


BAD = [  # (endpoint, body changes, the param named, words in the message)
    ("chat", {"messages": json.loads(deep(100))}, "messages", "deeper than 64 levels"),
    (
        "chat",
        {
            "messages": [
                *QUESTION,
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c",
                            "type": "function",
                            "function": {"name": "f", "arguments": deep(1000)},
                        }
                    ],
                },
            ]
        },
        "messages[1].tool_calls[0].function.arguments",
        "deeper than 32",
    ),  # fmt: skip
    ("completions", {"prompt": [2**70]}, "prompt", "[0, 49152)"),
    ("chat", {"response_format": {"type": "json_object"}}, "response_format", "not supported"),
    ("chat", {"logit_bias": {"15": 5}}, "logit_bias", "not supported"),
    ("chat", {"frequency_penalty": 0.5}, "frequency_penalty", "not supported"),
    ("chat", {"presence_penalty": 0.5}, "presence_penalty", "not supported"),
    ("completions", {"best_of": 3}, "best_of", "not supported"),
    ("completions", {"suffix": "end"}, "suffix", "not supported"),
    ("completions", {"skip_special_tokens": True}, "skip_special_tokens", "not supported"),
    (
        "chat",
        {
            "tool_choice": {"type": "function", "function": {"name": "nope"}},
            "tools": [{"type": "function", "function": {"name": "add"}}],
        },
        "tool_choice",
        "'nope'",
    ),  # fmt: skip
    (
        "chat",
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": "garbage"}}]},
        "tools[0].function.parameters",
        "JSON Schema object",
    ),  # fmt: skip
    ("chat", {"frobnicate": True}, "frobnicate", "Unrecognized request argument"),
]


@pytest.mark.parametrize(("endpoint", "change", "param", "words"), BAD)
def test_bad_requests_are_400s_naming_the_parameter(gateway, endpoint, change, param, words):
    body = {"model": "policy", "max_tokens": 1}
    body |= {"messages": QUESTION} if endpoint == "chat" else {"prompt": "Hi"}
    reply = post(gateway, f"{endpoint}/completions" if endpoint == "chat" else endpoint,
                 body | change, key="bad")  # fmt: skip
    assert reply.status_code == 400, reply.text
    error = error_of(reply)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param and words in error["message"], error
    assert gateway.recorder.calls("bad") == []


def test_raw_bodies_too_deep_or_not_unicode_are_400s(gateway):
    reply = post(gateway, "chat/completions", b'{"model": "policy", "messages": '
                 + deep(10_000).encode() + b"}")  # fmt: skip
    assert reply.status_code == 400 and "deeper than 64 levels" in error_of(reply)["message"]
    reply = post(gateway, "completions", b'{"model": "policy", "prompt": "\\ud800"}')
    assert reply.status_code == 400 and error_of(reply)["param"] == "prompt"
    assert "surrogate" in error_of(reply)["message"]


def test_neutral_values_of_unsupported_settings_are_accepted(gateway):
    reply = client(gateway, "neutral").chat.completions.create(
        model="policy", messages=QUESTION, max_tokens=1, frequency_penalty=0,
        presence_penalty=0.0, response_format={"type": "text"}, logit_bias={}, user="me",
        parallel_tool_calls=True,
    )  # fmt: skip
    assert reply.usage.completion_tokens == 1


def test_replies_sampled_in_chunks_are_recorded_as_sampled(policy, smol):
    tokenizer = smol[1]
    prompt = tokenizer.encode("The capital of France is")
    with Gateway(policy, tokenizer, model_name="policy", chunk_tokens=3) as chunked:
        reply = client(chunked, "chunks").completions.create(
            model="policy", prompt=prompt, max_tokens=10, temperature=0, logprobs=0,
            extra_body={"return_token_ids": True},
        )  # fmt: skip
        (call,) = chunked.recorder.calls("chunks")
    expected = policy.get_new_version(
        generate_kwargs={"max_new_tokens": 10, "do_sample": False}
    ).sample([np.asarray(prompt)])[0]
    assert reply.choices[0].model_extra["token_ids"] == call.tokens.tolist()
    assert call.tokens.tolist() == expected.tokens.tolist()  # four chunks, one greedy reply
    np.testing.assert_allclose(reply.choices[0].logprobs.token_logprobs, call.log_probs)
    np.testing.assert_allclose(call.log_probs, expected.log_probs, atol=1e-4)


def test_recorded_episodes_expire_and_are_capped():
    recorder = Recorder(ttl=0.2, max_episodes=2)
    for name in ("a", "b", "c"):
        recorder.reserve(name, 1, owner=name)
    assert sorted(recorder.names()) == ["b", "c"] and recorder.expired == 1
    time.sleep(0.3)
    assert recorder.names() == [] and recorder.expired == 3
