"""What fits a gateway's model, known before anything is tokenized or sampled: its context
(``context_length``), the reply tokens a sampler gives when not told (``default_budget``),
and the bytes a prompt's text must have at least per token (``max_token_bytes``,
``text_bytes``): the gateway's 400 ``context_length_exceeded`` comes from these."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llm_gym.agents._wire import BadRequest, Request

__all__ = [
    "check_text_size",
    "context_length",
    "default_budget",
    "max_token_bytes",
    "reply_budget",
    "text_bytes",
    "too_long",
]


def context_length(sampler: object, tokenizer: object = None) -> int | None:
    """The positions the sampler's model has (a prompt and its reply together), from its
    transformers config (``max_position_embeddings``, ``n_positions``), a vLLM sampler's
    ``max_model_len``, else the tokenizer's ``model_max_length`` when it is a real one;
    None when unknown.

    >>> context_length(object()) is None
    True
    """
    for owner in (sampler, getattr(sampler, "sampler", None)):
        config = getattr(getattr(owner, "model", None), "config", None)
        for name in ("max_position_embeddings", "n_positions", "max_sequence_length"):
            value = getattr(config, name, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        value = getattr(owner, "max_model_len", None)
        if isinstance(value, int) and value > 0:
            return value
    value = getattr(tokenizer, "model_max_length", None)
    return value if isinstance(value, int) and 0 < value < 10**7 else None  # else a sentinel


def text_bytes(content: object) -> int:
    """The UTF-8 bytes of a message's text: a string, or a list of content parts' texts."""
    if isinstance(content, str):
        return len(content.encode())
    if isinstance(content, list):
        return sum(text_bytes(p.get("text")) for p in content if isinstance(p, Mapping))
    return 0


def default_budget(sampler: object) -> int | None:
    """The reply tokens ``sampler`` gives when not told (its ``max_new_tokens``)."""
    for owner in (sampler, getattr(sampler, "sampler", None)):
        value = getattr(owner, "max_new_tokens", None)
        if value is None and isinstance(getattr(owner, "generate_kwargs", None), Mapping):
            value = owner.generate_kwargs.get("max_new_tokens")
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def max_token_bytes(tokenizer: Any) -> int | None:
    """The most UTF-8 bytes one token's text holds (special tokens included); None if the
    tokenizer cannot list its tokens. A byte-level token's string has a character per byte,
    each at least a byte: its length bounds the bytes it stands for."""
    try:
        pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        return max(len(str(p).encode("utf-8", "surrogatepass")) for p in pieces if p) or None
    except Exception:  # a tokenizer of another kind: no bound, every prompt is tokenized
        return None


def too_long(context: int | None, tokens: str, chat: bool) -> BadRequest:
    """OpenAI's 400 ``context_length_exceeded`` for a prompt of ``tokens`` tokens."""
    what = "messages" if chat else "prompt"
    return BadRequest(
        f"This model's maximum context length is {context} tokens. However, "
        f"your {what} resulted in {tokens} tokens. Please reduce the length of the {what}.",
        what, 400, "context_length_exceeded",
    )  # fmt: skip


def check_text_size(body: Request, context: int | None, token_bytes: int | None) -> None:
    """A ``context_length_exceeded`` for text too long to fit, before it is tokenized
    (a 5 MB message took the tokenizer seconds and the sampler all the memory): no token
    holds more than ``token_bytes`` of UTF-8 (halved again for normalizers)."""
    if context is None or token_bytes is None:
        return
    if body.chat:
        size = sum(text_bytes(m.get("content")) for m in body.messages)
    elif isinstance(body.prompt, str):
        size = len(body.prompt.encode())
    else:
        return
    least = size // (2 * token_bytes)
    if least >= context:
        raise too_long(context, f"at least {least}", body.chat)


def reply_budget(
    prompt_tokens: int, requested: int | None, default: int | None, context: int | None,
    chat: bool,
) -> int | None:  # fmt: skip
    """The tokens a reply may have: those asked for (else the sampler's ``default``), at most
    the ``context`` less the prompt; a ``context_length_exceeded`` for a prompt that leaves
    no room.

    >>> reply_budget(10, 10**9, 16, 1024, chat=False), reply_budget(10, None, 16, None, True)
    (1014, 16)
    """
    room = None
    if context is not None:
        room = context - prompt_tokens
        if room < 1:
            raise too_long(context, str(prompt_tokens), chat)
    budget = requested if requested is not None else default
    if budget is None or room is None:
        return budget
    return min(budget, room)
