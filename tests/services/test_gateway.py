"""The gateway (issue 40): a real uvicorn server on loopback in front of the default model,
called with the official ``openai`` SDK; every recorded call checked against what the sampler
returns for the same prompt, token for token."""

import json
import threading

import httpx
import numpy as np
import openai
import pytest
import torch
from gateway_fixture import QUESTION, client, gateway, policy  # noqa: F401  (fixtures)

from llm_gym.agents import Gateway, segments
from llm_gym.chat.history import History
from llm_gym.samplers import Sample


def template_ids(tokenizer, messages):
    return History(messages).apply_chat_template(
        tokenizer, add_generation_prompt=True, tokenize=True
    )


def greedy(policy, prompt, max_new_tokens):
    kwargs = {"max_new_tokens": max_new_tokens, "do_sample": False}
    return policy.get_new_version(generate_kwargs=kwargs).sample([prompt])[0]


def test_models_lists_the_served_name(gateway):
    (model,) = client(gateway).models.list().data
    assert (model.id, model.object) == ("policy", "model")


def test_a_chat_call_is_recorded_as_the_sampler_returned_it(gateway, policy, smol):
    tokenizer = smol[1]
    reply = client(gateway, "exact").chat.completions.create(
        model="policy", messages=QUESTION, temperature=0, max_tokens=10, logprobs=True
    )
    prompt = template_ids(tokenizer, QUESTION)
    expected = greedy(policy, prompt, 10)
    (call,) = gateway.recorder.calls("exact")
    assert np.array_equal(call.prompt_ids, prompt)  # the chat template's ids
    assert np.array_equal(call.tokens, expected.tokens)  # as sampled, not re-tokenized
    np.testing.assert_allclose(call.log_probs, expected.log_probs, atol=1e-5)
    assert (call.parent, call.prompt_mask.any(), call.version) == (None, False, 0)
    choice = reply.choices[0]
    text = tokenizer.decode(expected.tokens, skip_special_tokens=True)
    assert choice.message.content == text and choice.finish_reason == expected.finish_reason
    assert reply.usage.prompt_tokens == len(prompt)
    assert reply.usage.completion_tokens == len(expected.tokens)
    values = [item.logprob for item in choice.logprobs.content]
    np.testing.assert_allclose(values, expected.log_probs, atol=1e-5)
    assert "".join(item.token for item in choice.logprobs.content) == tokenizer.decode(
        expected.tokens
    )


def test_a_continued_conversation_is_one_sequence_with_the_mask_on_sampled_tokens(gateway):
    chat = client(gateway, "continued").chat.completions
    messages = list(QUESTION)
    first = chat.create(model="policy", messages=messages, max_tokens=8)
    messages += [first.choices[0].message, {"role": "user", "content": "And 3 + 4?"}]
    chat.create(model="policy", messages=messages, max_tokens=8)
    one, two = gateway.recorder.calls("continued")
    assert two.parent == one.index
    head = np.concatenate([one.prompt_ids, one.tokens])
    assert np.array_equal(two.prompt_ids[: len(head)], head)  # token-in, token-out
    (segment,) = segments([one, two])
    assert np.array_equal(segment.ids, np.concatenate([two.prompt_ids, two.tokens]))
    sampled = np.zeros(len(segment.ids), bool)
    sampled[len(one.prompt_ids) : len(head)] = True
    sampled[len(two.prompt_ids) :] = True
    assert np.array_equal(segment.policy_mask, sampled)
    assert np.array_equal(segment.log_probs, np.concatenate([one.log_probs, two.log_probs]))
    assert segment.calls == (one.index, two.index)


def test_a_rewritten_history_starts_a_segment_of_its_own(gateway):
    chat = client(gateway, "rewritten").chat.completions
    first = chat.create(model="policy", messages=QUESTION, max_tokens=6)
    edited = {"role": "assistant", "content": first.choices[0].message.content + " (edited)"}
    chat.create(model="policy", messages=[*QUESTION, edited, {"role": "user", "content": "ok"}])
    calls = gateway.recorder.calls("rewritten")
    assert [c.parent for c in calls] == [None, None]
    parts = segments(calls)
    assert len(parts) == 2 and [p.calls for p in parts] == [(0,), (1,)]
    assert int(parts[1].policy_mask.sum()) == len(calls[1].tokens)  # only its own tokens


def test_streaming_gives_the_same_reply_and_usage(gateway):
    chat = client(gateway, "stream").chat.completions
    whole = chat.create(model="policy", messages=QUESTION, temperature=0, max_tokens=10)
    chunks = list(chat.create(
        model="policy", messages=QUESTION, temperature=0, max_tokens=10, stream=True,
        stream_options={"include_usage": True},
    ))  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == whole.choices[0].finish_reason and set(finishes[:-1]) == {None}
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert len(gateway.recorder.calls("stream")) == 2


def test_n_seed_and_stop(gateway, smol):
    chat = client(gateway, "settings").chat.completions
    several = chat.create(model="policy", messages=QUESTION, n=3, max_tokens=6, seed=7)
    again = chat.create(model="policy", messages=QUESTION, n=3, max_tokens=6, seed=7)
    texts = [c.message.content for c in several.choices]
    assert [c.index for c in several.choices] == [0, 1, 2]
    assert texts == [c.message.content for c in again.choices]  # the same seed, the same draws
    assert len(gateway.recorder.calls("settings")) == 6
    plain = chat.create(model="policy", messages=QUESTION, temperature=0, max_tokens=12)
    content = plain.choices[0].message.content
    stop = content[len(content) // 2 : len(content) // 2 + 2]
    cut = chat.create(model="policy", messages=QUESTION, temperature=0, max_tokens=12, stop=stop)
    assert cut.choices[0].message.content == content[: content.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    call = gateway.recorder.calls("settings")[-1]
    # The tokens kept are the fewest whose text holds the stop string.
    decoded = smol[1].decode(call.tokens)
    assert stop in decoded and stop not in smol[1].decode(call.tokens[:-1])


def test_bad_requests_get_openai_errors_naming_the_parameter(gateway):
    chat = client(gateway).chat.completions
    with pytest.raises(openai.NotFoundError) as error:
        chat.create(model="gpt-4o", messages=QUESTION)
    assert error.value.body["code"] == "model_not_found" and "'policy'" in error.value.message
    cases = [
        ({"messages": []}, "messages", "non-empty list"),
        ({"temperature": 3}, "temperature", "in [0, 2]"),
        ({"max_tokens": 0}, "max_tokens", ">= 1"),
        ({"n": 2, "temperature": 0}, "n", "needs temperature > 0"),
        ({"top_logprobs": 3, "logprobs": True}, "top_logprobs", "not supported"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4"),
        ({"messages": [{"content": "no role"}]}, "messages[0]", "'role'"),
        ({"tools": [{"type": "function"}]}, "tools", "function"),
    ]
    for change, param, words in cases:
        kwargs = {"model": "policy", "messages": QUESTION} | change
        with pytest.raises(openai.BadRequestError) as error:
            chat.create(**kwargs)
        assert error.value.body["param"] == param and words in error.value.body["message"]
    reply = httpx.post(f"{gateway.url}/v1/chat/completions", content=b"{not json")
    assert reply.status_code == 400 and "JSON" in reply.json()["error"]["message"]
    assert gateway.recorder.calls("episode") == []  # nothing was sampled for a bad request


def test_the_completions_endpoint_continues_token_prompts(gateway, smol):
    completions = client(gateway, "text").completions
    prompt = smol[1].encode("1 + 1 =")
    first = completions.create(
        model="policy", prompt=prompt, max_tokens=4, logprobs=0,
        extra_body={"return_token_ids": True},
    )  # fmt: skip
    choice = first.choices[0]
    (call,) = gateway.recorder.calls("text")
    assert choice.model_extra["token_ids"] == call.tokens.tolist()
    assert first.model_extra["prompt_token_ids"] == prompt
    np.testing.assert_allclose(choice.logprobs.token_logprobs, call.log_probs, atol=1e-6)
    more = [*prompt, *call.tokens.tolist(), *smol[1].encode(" and")]
    completions.create(model="policy", prompt=more, max_tokens=3)
    second = gateway.recorder.calls("text")[1]
    assert second.parent == call.index
    assert second.prompt_mask.tolist() == [False] * len(prompt) + [True] * len(call.tokens) + [
        False
    ] * (len(more) - len(prompt) - len(call.tokens))
    with pytest.raises(openai.BadRequestError) as error:
        completions.create(model="policy", prompt=[10**9], max_tokens=2)
    assert error.value.body["param"] == "prompt" and "[0, 49152)" in error.value.body["message"]


def test_episodes_over_http_and_closed_episodes(gateway):
    client(gateway, "listed").chat.completions.create(
        model="policy", messages=QUESTION, max_tokens=3
    )
    (call,) = gateway.recorder.calls("listed")
    url, owner = f"{gateway.url}/v1/episodes/listed", {"Authorization": "Bearer listed"}
    got = httpx.get(url, headers=owner).json()["calls"]
    assert got[0]["token_ids"] == call.tokens.tolist()
    assert got[0]["prompt_ids"] == call.prompt_ids.tolist()
    assert httpx.delete(url, headers=owner).status_code == 200
    assert httpx.get(url, headers=owner).status_code == 404
    gateway.recorder.close("listed")
    with pytest.raises(openai.PermissionDeniedError, match="is over"):
        client(gateway, "listed").chat.completions.create(model="policy", messages=QUESTION)


def test_the_episode_header_names_the_episode(gateway):
    headers = {"X-Episode-Id": "by-header"}
    client(gateway, "key").with_options(default_headers=headers).chat.completions.create(
        model="policy", messages=QUESTION, max_tokens=2
    )
    assert len(gateway.recorder.calls("by-header")) == 1 and not gateway.recorder.calls("key")


class Counting:
    """The policy's own samples, with the size of each batch it was asked for."""

    def __init__(self, policy):
        self.policy, self.sizes, self.version = policy, [], 0

    def sample(self, prompts):
        self.sizes.append(len(prompts))
        return self.policy.sample(prompts)


def test_requests_in_flight_are_sampled_in_one_batch(policy, smol):
    counting = Counting(policy)
    with Gateway(counting, smol[1], model_name="policy") as gateway:
        errors = []

        def call(i):
            try:
                client(gateway, f"agent-{i}").chat.completions.create(
                    model="policy", messages=[{"role": "user", "content": f"Say {i}."}]
                )
            except Exception as error:  # reported below
                errors.append(error)

        threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == [] and sum(counting.sizes) == 8
        assert max(counting.sizes) > 1, counting.sizes
        # A sampler with fixed settings refuses per-request ones, naming them.
        with pytest.raises(openai.BadRequestError, match="leave out temperature"):
            client(gateway).chat.completions.create(
                model="policy", messages=QUESTION, temperature=0.5
            )


class Replay:
    """A sampler that returns given text's tokens: the model's tool call, written out, so
    that the parsing of a call (which the 135M model rarely writes) is exercised."""

    def __init__(self, tokenizer, texts):
        self.tokenizer, self.texts, self.version = tokenizer, list(texts), 3

    def sample(self, prompts):
        out = []
        for _ in prompts:
            ids = self.tokenizer.encode(self.texts.pop(0)) + [self.tokenizer.eos_token_id]
            out.append(Sample(np.asarray(ids), np.full(len(ids), -0.5, np.float32), "stop", 3))
        return out


def test_tool_calls_in_openai_format_and_their_results_continue_the_sequence(smol):
    tokenizer = smol[1]
    call_text = 'Let me add.<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    tools = [{"type": "function", "function": {
        "name": "add", "parameters": {"type": "object", "properties": {}},
    }}]  # fmt: skip
    with Gateway(Replay(tokenizer, [call_text, "5"]), tokenizer, model_name="policy") as gateway:
        chat = client(gateway, "tools").chat.completions
        reply = chat.create(model="policy", messages=QUESTION, tools=tools)
        message = reply.choices[0].message
        assert reply.choices[0].finish_reason == "tool_calls"
        assert message.content == "Let me add."
        (call,) = message.tool_calls
        assert call.function.name == "add" and json.loads(call.function.arguments) == {
            "a": 2, "b": 3,
        }  # fmt: skip
        messages = [*QUESTION, message, {"role": "tool", "tool_call_id": call.id, "content": "5"}]
        final = chat.create(model="policy", messages=messages, tools=tools)
        assert final.choices[0].message.content == "5"
        first, second = gateway.recorder.calls("tools")
        assert second.parent == first.index and first.version == 3
        prompt_text = tokenizer.decode(first.prompt_ids)
        assert '"name": "add"' in prompt_text  # the tools listed in the system prompt
        (segment,) = segments([first, second])
        assert int(segment.policy_mask.sum()) == len(first.tokens) + len(second.tokens)
        # tool_choice "none": no tool listed, the call's text is only text.
    with Gateway(Replay(tokenizer, [call_text]), tokenizer, model_name="policy") as gateway:
        plain = client(gateway).chat.completions.create(
            model="policy", messages=QUESTION, tools=tools, tool_choice="none"
        )
        assert plain.choices[0].message.tool_calls is None
        assert plain.choices[0].message.content == call_text


def test_a_sampler_failure_is_a_server_error_and_the_gateway_goes_on(policy, smol):
    class Failing(Counting):
        def sample(self, prompts):
            if len(self.sizes) == 0:
                self.sizes.append(0)
                raise RuntimeError("the server died")
            return super().sample(prompts)

    with Gateway(Failing(policy), smol[1], model_name="policy") as gateway:
        with pytest.raises(openai.InternalServerError, match="the server died"):
            client(gateway).chat.completions.create(model="policy", messages=QUESTION)
        reply = client(gateway).chat.completions.create(model="policy", messages=QUESTION)
        assert reply.choices[0].message.content is not None


def test_seeded_requests_keep_the_global_generator(gateway):
    torch.manual_seed(123)
    expected = torch.rand(1)
    torch.manual_seed(123)
    client(gateway, "seeded").chat.completions.create(
        model="policy", messages=QUESTION, seed=5, max_tokens=2
    )
    assert torch.equal(torch.rand(1), expected)


def test_the_gateway_command_serves_the_model_until_interrupted():
    import re
    import signal
    import subprocess
    import sys

    process = subprocess.Popen(
        [sys.executable, "-m", "llm_gym", "gateway", "--port", "0", "--max-new-tokens", "4",
         "--threads", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        line = process.stdout.readline()
        found = re.search(r"serving 'policy' at (http://127\.0\.0\.1:\d+)/v1", line)
        assert found, (line, process.stderr.read() if process.poll() is not None else "")
        url = found.group(1)
        chat = openai.OpenAI(base_url=f"{url}/v1", api_key="cli", max_retries=0).chat
        reply = chat.completions.create(model="policy", messages=QUESTION)
        assert reply.usage.completion_tokens <= 4  # --max-new-tokens, no max_tokens given
        owner = {"Authorization": "Bearer cli"}
        calls = httpx.get(f"{url}/v1/episodes/cli", headers=owner).json()["calls"]
        assert len(calls) == 1 and len(calls[0]["token_ids"]) == reply.usage.completion_tokens
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 130


def test_the_gateway_command_refuses_bad_flags(capsys):
    from llm_gym.cli import main

    assert main(["gateway", "--backend", "openai"]) == 2
    assert "base_url" in capsys.readouterr().err


def test_the_developer_role_is_the_system_role(gateway, smol):
    messages = [{"role": "developer", "content": "Be brief."}, *QUESTION]
    client(gateway, "developer").chat.completions.create(
        model="policy", messages=messages, max_tokens=2
    )
    (call,) = gateway.recorder.calls("developer")
    system = [{"role": "system", "content": "Be brief."}, *QUESTION]
    assert np.array_equal(call.prompt_ids, template_ids(smol[1], system))
