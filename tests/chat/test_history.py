"""History, chat templates and the containers."""

import numpy as np
import pytest

from llm_gym import ChatHistory, History, Response, Tokens
from llm_gym.chat import CHATML_TEMPLATE, LLAMA_TEMPLATE, resolve_chat_template

MULTI_TURN = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name a colour."},
    {"role": "assistant", "content": "Blue."},
    {"role": "user", "content": "Another, please?"},
    {"role": "assistant", "content": "Green, then red!"},
]


def test_from_chats_append_extend_and_iteration():
    h = History.from_chats(MULTI_TURN[:2])
    assert isinstance(h, History) and len(h) == 2
    assert h.append({"role": "assistant", "content": "x"}) is h
    h.extend(MULTI_TURN[3:])
    assert h.roles == ["system", "user", "assistant", "user", "assistant"]
    assert [m["content"] for m in h][-1] == "Green, then red!"
    batch = History.from_chats([MULTI_TURN[:1], MULTI_TURN[:3]])
    assert [len(b) for b in batch] == [1, 3]
    # Iteration yields copies: editing one does not touch the History.
    next(iter(h))["content"] = "changed"
    assert h[0]["content"] == "You are terse."


def test_bad_messages_raise_typeerror_and_keep_history():
    h = History.from_chats(MULTI_TURN[:2])
    with pytest.raises(TypeError, match="message must be a mapping.*got str"):
        h.append("hello")
    with pytest.raises(TypeError, match="content=int"):
        h.append({"role": "user", "content": 3})
    assert h.roles == ["system", "user"]


def test_chatml_text_exact():
    h = History.from_chats(MULTI_TURN[:2])
    text = h.apply_chat_template(chat_template_name="chatml_format", add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.parametrize("name", ["chatml_format", "qwen", "llama"])
def test_round_trip_history_text_history(name):
    h = History.from_chats(MULTI_TURN)
    text = h.apply_chat_template(chat_template_name=name)
    back = History.from_text(text, chat_template_name=name)
    assert back == h and back.is_complete


@pytest.mark.parametrize("name", ["chatml_format", "qwen", "llama"])
def test_round_trip_incomplete_last_message(name):
    h = History.from_chats(MULTI_TURN[:4]).append(
        {"role": "assistant", "content": "Gre", "is_complete": False}
    )
    text = h.apply_chat_template(chat_template_name=name)
    assert text.endswith("Gre")
    back = History.from_text(text, chat_template_name=name)
    assert back == h
    assert not back.is_complete and back[-1]["content"] == "Gre"
    assert back[-1]["is_complete"] is False


def test_generation_prompt_parses_as_empty_incomplete_assistant():
    text = History.from_chats(MULTI_TURN[:2]).apply_chat_template(
        chat_template_name="llama", add_generation_prompt=True
    )
    back = History.from_text(text, chat_template_name="llama")
    assert back.roles == ["system", "user", "assistant"]
    assert back[-1]["content"] == "" and not back.is_complete


def test_from_text_errors():
    with pytest.raises(ValueError, match="chat_template_name must be one of"):
        History.from_text("x", chat_template_name="nope")
    with pytest.raises(TypeError, match="text must be a str, got bytes"):
        History.from_text(b"x")


@pytest.mark.parametrize("tokenizer_name", ["gpt2_tokenizer", "smollm2_tokenizer"])
def test_assistant_mask_selects_assistant_contents(tokenizer_name, request):
    tokenizer = request.getfixturevalue(tokenizer_name)
    h = History.from_chats(MULTI_TURN)
    out = h.apply_chat_template(
        tokenizer, chat_template_name="chatml_format", return_assistant_tokens_mask=True
    )
    ids, mask = out["input_ids"], out["assistant_masks"]
    assert ids.dtype == np.int64 and mask.dtype == bool and ids.shape == mask.shape
    # Each contiguous masked run is one assistant turn: its content plus the end-of-turn token.
    edges = np.flatnonzero(np.diff(np.r_[0, mask.astype(int), 0]))
    turns = [
        tokenizer.decode(ids[s:e].tolist()) for s, e in zip(edges[::2], edges[1::2], strict=True)
    ]
    assert turns == ["Blue.<|im_end|>", "Green, then red!<|im_end|>"]
    assert "<|im_start|>" not in "".join(turns) and "assistant" not in "".join(turns)


def test_assistant_mask_skipping_special_tokens_is_exactly_the_contents(smollm2_tokenizer):
    out = History.from_chats(MULTI_TURN).apply_chat_template(
        smollm2_tokenizer, return_assistant_tokens_mask=True
    )
    masked = out["input_ids"][out["assistant_masks"]].tolist()
    assert smollm2_tokenizer.decode(masked, skip_special_tokens=True) == "Blue.Green, then red!"


def test_offset_fallback_mask_for_template_without_markers(smollm2_tokenizer, gpt2_tokenizer):
    plain = CHATML_TEMPLATE.replace("{% generation %}", "").replace("{% endgeneration %}", "")
    out = History.from_chats(MULTI_TURN).apply_chat_template(
        smollm2_tokenizer, chat_template=plain, return_assistant_tokens_mask=True
    )
    masked = out["input_ids"][out["assistant_masks"]].tolist()
    assert smollm2_tokenizer.decode(masked) == "Blue.Green, then red!"
    # GPT-2's BPE merges "." with the "<" of a non-special "<|im_end|>": a token that
    # straddles the content's edge is counted as the assistant's.
    out = History.from_chats(MULTI_TURN).apply_chat_template(
        gpt2_tokenizer, chat_template=plain, return_assistant_tokens_mask=True
    )
    masked = out["input_ids"][out["assistant_masks"]].tolist()
    assert gpt2_tokenizer.decode(masked) == "Blue.<Green, then red!"


def test_tokenize_needs_tokenizer():
    with pytest.raises(ValueError, match="tokenizer is required"):
        History.from_chats(MULTI_TURN).apply_chat_template(tokenize=True)


def test_template_resolution(gpt2_tokenizer, smollm2_tokenizer):
    assert resolve_chat_template(None, "llama") == LLAMA_TEMPLATE
    # SmolLM2's own template already has markers (llm_gym installs its ChatML one).
    assert resolve_chat_template(smollm2_tokenizer) == smollm2_tokenizer.chat_template
    assert resolve_chat_template(gpt2_tokenizer) == CHATML_TEMPLATE

    class QwenLike:
        name_or_path = "Qwen/Qwen2.5-0.5B-Instruct"
        chat_template = "{{ messages }}"

    assert "You are Qwen" in resolve_chat_template(QwenLike())
    with pytest.raises(ValueError, match="chat_template_name must be one of .*got 'x'"):
        resolve_chat_template(None, "x")


def test_containers_convert_history_text_tokens(smollm2_tokenizer):
    prompt = History.from_chats(MULTI_TURN[:2])
    response = History.from_chats([{"role": "assistant", "content": "Blue."}])
    chat = ChatHistory(prompt=prompt, response=response)
    assert chat.full.roles == ["system", "user", "assistant"]
    text = chat.to_text(smollm2_tokenizer)
    assert text.prompt.endswith("<|im_start|>assistant\n")
    assert text.response == "Blue.<|im_end|>\n"
    tokens = text.to_tokens(smollm2_tokenizer)
    assert np.array_equal(tokens.full, np.r_[tokens.prompt, tokens.response])
    assert smollm2_tokenizer.decode(tokens.response.tolist()) == "Blue.<|im_end|>\n"
    assert tokens.to_text(smollm2_tokenizer).full == text.full
    assert np.array_equal(Tokens(prompt=[1, 2], response=[3]).full, [1, 2, 3])


def test_response_validation():
    r = Response("hi", tokens=[5, 6], log_probs=[-1.0, -2.0])
    assert r.tokens.tolist() == [5, 6] and r.log_probs.dtype == np.float32
    with pytest.raises(ValueError, match="one value per token: got 1 log-probs for 2 tokens"):
        Response("hi", tokens=[5, 6], log_probs=[-1.0])
    with pytest.raises(TypeError, match="Response.text must be a str, got int"):
        Response(3)
    with pytest.raises(TypeError, match="integer token ids, got dtype float64"):
        Response("hi", tokens=np.array([1.5]))
