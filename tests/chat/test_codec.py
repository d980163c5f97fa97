"""TokenCodec: batched encode/decode equal to the tokenizer's own, one call per batch."""

import gymnasium as gym
import numpy as np
import pytest

from llm_gym.chat import TokenCodec
from llm_gym.envs import DatasetChatEnv, DatasetChatVectorEnv

TEXTS = [
    "Janet's ducks lay 16 eggs per day.",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n",
    "  leading spaces, émojis 🦆 and\ttabs",
    "",
    "Janet's ducks lay 16 eggs per day.",  # a repeat
]


@pytest.mark.parametrize("tokenizer_name", ["gpt2_tokenizer", "smollm2_tokenizer"])
def test_encode_and_decode_many_equal_the_tokenizer(tokenizer_name, request):
    tokenizer = request.getfixturevalue(tokenizer_name)
    codec = TokenCodec(tokenizer)
    encoded = codec.encode_many(TEXTS)
    for text, ids in zip(TEXTS, encoded, strict=True):
        assert ids.dtype == np.int64
        assert ids.tolist() == tokenizer(text, add_special_tokens=False)["input_ids"]
    assert encoded[0] is encoded[4]  # a repeated text is encoded once
    assert not encoded[0].flags.writeable  # shared, so read-only
    for skip in (True, False):
        decoded = codec.decode_many(encoded, skip_special_tokens=skip)
        expected = [tokenizer.decode(ids.tolist(), skip_special_tokens=skip) for ids in encoded]
        assert decoded == expected
    assert codec.encode(TEXTS[2]).tolist() == encoded[2].tolist()


def test_shared_prefix_gives_the_same_ids_and_encodes_only_the_rest(smollm2_tokenizer):
    codec = TokenCodec(smollm2_tokenizer)
    system = "<|im_start|>system\nBe brief.<|im_end|>\n"
    codec.share_prefix(system)
    prompts = [system + f"<|im_start|>user\nQuestion {i}?<|im_end|>\n" for i in range(4)]
    assert codec.shared_prefix == system
    calls = []
    codec.backend = _Recorder(codec.backend, calls)
    for prompt, ids in zip(prompts, codec.encode_many(prompts), strict=True):
        assert ids.tolist() == smollm2_tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert calls == [("encode_batch", [prompt[len(system) :] for prompt in prompts])]  # rests
    # a prompt that does not start with the prefix is encoded whole
    other = "<|im_start|>user\nNo system.<|im_end|>\n"
    assert (
        codec.encode(other).tolist()
        == smollm2_tokenizer(other, add_special_tokens=False)["input_ids"]
    )


def test_end_of_turn_reads_the_last_token_only(smollm2_tokenizer, gpt2_tokenizer):
    codec = TokenCodec(smollm2_tokenizer)
    im_end = smollm2_tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert codec.end_of_turn(np.array([5, 6, im_end])) == "<|im_end|>"
    assert codec.end_of_turn(np.array([im_end, 6])) is None
    assert codec.end_of_turn(np.array([], dtype=np.int64)) is None
    assert codec.end_of_turn(None) is None
    gpt2 = TokenCodec(gpt2_tokenizer)
    assert gpt2.end_of_turn(np.array([50256])) == "<|endoftext|>"


def test_check_ids_names_the_first_bad_id(smollm2_tokenizer):
    codec = TokenCodec(smollm2_tokenizer)
    vocab = len(smollm2_tokenizer)
    with pytest.raises(ValueError, match=rf"must lie in \[0, {vocab}\), got -1"):
        codec.check_ids(np.array([3, -1, vocab]))
    with pytest.raises(ValueError, match=rf"got {vocab}"):
        codec.check_ids(np.array([3, vocab]))
    codec.check_ids(np.array([0, vocab - 1]))  # the bounds themselves are fine


def test_vector_env_decodes_token_actions_in_one_batch_with_single_env_results(
    smollm2_tokenizer,
):
    rows = [{"query": f"q{i}?"} for i in range(4)]
    base = DatasetChatEnv(rows, input_mode="tokens", tokenizer=smollm2_tokenizer, shuffle=False)
    envs = DatasetChatVectorEnv(base, num_envs=2)
    first, _ = envs.reset(seed=0)
    texts = ["first answer<|im_end|>", "second"]
    actions = [np.asarray(smollm2_tokenizer(t)["input_ids"], dtype=np.int64) for t in texts]
    calls = []
    envs.single_env.codec.backend = _Recorder(envs.single_env.codec.backend, calls)
    obs, _, terminated, _, info = envs.step(actions)
    assert [len(rows) for name, rows in calls if name == "decode_batch"] == [2]  # one call
    assert terminated.tolist() == [True, True]
    # each sampled response sits right after its prompt, never re-tokenized
    for prompt, final, action in zip(first["tokens"], info["final_obs"], actions, strict=True):
        n = len(prompt)
        assert final["tokens"][:n].tolist() == prompt.tolist()
        assert final["tokens"][n : n + len(action)].tolist() == action.tolist()
    single = DatasetChatEnv(rows, input_mode="tokens", tokenizer=smollm2_tokenizer, shuffle=False)
    single.reset(seed=0)
    final, *_ = single.step(actions[0])
    assert np.array_equal(final["tokens"], info["final_obs"][0]["tokens"])
    # the next prompts, tokenized in one batch at the autoreset, equal a fresh encoding
    for tokens in obs["tokens"]:
        text = smollm2_tokenizer.decode(tokens.tolist())
        assert tokens.tolist() == smollm2_tokenizer(text, add_special_tokens=False)["input_ids"]


def test_vector_env_names_a_bad_token_action_and_steps_nothing(smollm2_tokenizer):
    rows = [{"query": f"q{i}?"} for i in range(4)]
    envs = gym.make_vec(
        "LLMChat-GSM8K-v0",
        num_envs=2,
        vectorization_mode="vector_entry_point",
        dataset=[{"question": r["query"], "answer": "#### 1"} for r in rows],
        input_mode="tokens",
        tokenizer=smollm2_tokenizer,
    )
    obs, _ = envs.reset(seed=0)
    good = np.array([5, 6], dtype=np.int64)
    with pytest.raises(ValueError, match=r"actions\[1\]: action token ids must lie in .*got -3"):
        envs.step([good, np.array([5, -3], dtype=np.int64)])
    again, *_ = envs.step([good, good])  # nothing was stored by the refused step
    for before, after in zip(obs["tokens"], again["tokens"], strict=True):
        assert not np.array_equal(before, after)  # each sub-env took its step once


class _Recorder:
    """A ``TokenCodec.backend`` that records each call as (method, texts or rows)."""

    def __init__(self, backend, calls):
        self.backend, self.calls = backend, calls

    def encode(self, text, **kwargs):
        self.calls.append(("encode", [text]))
        return self.backend.encode(text, **kwargs)

    def encode_batch(self, texts, **kwargs):
        self.calls.append(("encode_batch", list(texts)))
        return self.backend.encode_batch(texts, **kwargs)

    def decode_batch(self, rows, **kwargs):
        self.calls.append(("decode_batch", rows))
        return self.backend.decode_batch(rows, **kwargs)

    def __getattr__(self, name):
        return getattr(self.backend, name)
