"""Plain containers for what a policy sees and produces: TorchRL's Text, Tokens, Masks,
LogProbs and ChatHistory without TensorDict (``full`` is always prompt + response), plus the
``Response`` an action can carry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from llm_gym.chat.codec import TokenCodec
from llm_gym.chat.history import History
from llm_gym.checks import check_str

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["Response", "Text", "Tokens", "Masks", "LogProbs", "ChatHistory"]


def _int_array(name: str, value: Any) -> np.ndarray | None:
    if value is None:
        return None
    array = np.asarray(value)
    if array.ndim != 1 or (array.size and not np.issubdtype(array.dtype, np.integer)):
        raise TypeError(
            f"{name} must be a 1-D array of integer token ids, got dtype {array.dtype} "
            f"with shape {array.shape}"
        )
    return array.astype(np.int64, copy=True)


@dataclass(frozen=True)
class Response:
    """The assistant's turn as a policy produced it.

    ``tokens`` are the exact ids that were sampled, so no one downstream has to re-tokenize
    ``text``; ``log_probs`` holds log π(token | prefix), one per token; ``version`` is the
    policy version that sampled it (None where unknown), which the conversation records.

    ``text`` and ``tokens`` are one response: an env with a tokenizer checks that ``text`` is
    what its tokenizer decodes ``tokens`` to (with special tokens, as the policies decode, or
    without) and refuses a mismatch with a ValueError naming both, before anything changes,
    since the reward reads the text and a trainer learns from the tokens. Without a
    tokenizer the env cannot check, and takes both as given.

    >>> r = Response("Paris", tokens=[40313], log_probs=[-0.5])
    >>> r.tokens.dtype, r.log_probs.dtype
    (dtype('int64'), dtype('float32'))
    """

    text: str
    tokens: np.ndarray | None = None
    log_probs: np.ndarray | None = None
    version: int | None = None

    def __post_init__(self) -> None:
        check_str("Response.text", self.text)
        tokens = _int_array("Response.tokens", self.tokens)
        log_probs = None
        if self.log_probs is not None:
            log_probs = np.asarray(self.log_probs, dtype=np.float32).reshape(-1).copy()
            if tokens is None:
                raise ValueError("Response.log_probs were given without Response.tokens")
            if len(log_probs) != len(tokens):
                raise ValueError(
                    f"Response.log_probs must have one value per token: got {len(log_probs)} "
                    f"log-probs for {len(tokens)} tokens"
                )
        object.__setattr__(self, "tokens", tokens)
        object.__setattr__(self, "log_probs", log_probs)

    @classmethod
    def from_mapping(cls, action: dict[str, Any]) -> Response:
        """A Response from a dict with a ``"text"`` key (and optional tokens/log_probs)."""
        if "text" not in action:
            raise TypeError(
                f"a dict action must have a 'text' key (like Response), got keys {sorted(action)}"
            )
        return cls(action["text"], *(action.get(k) for k in ("tokens", "log_probs", "version")))


@dataclass
class Text:
    """Rendered chat text: the prompt (with its generation prompt), the response, the whole."""

    prompt: str | None = None
    response: str | None = None
    full: str | None = None

    def to_tokens(self, tokenizer: PreTrainedTokenizerBase) -> Tokens:
        """Tokenize prompt and full; the response tokens are what full adds to the prompt."""
        encode = TokenCodec(tokenizer).encode
        prompt = None if self.prompt is None else encode(self.prompt)
        full = None if self.full is None else encode(self.full)
        response = None
        if prompt is not None and full is not None and np.array_equal(full[: len(prompt)], prompt):
            response = full[len(prompt) :]
        elif self.response is not None:
            response = encode(self.response)
        return Tokens(prompt=prompt, response=response, full=full)


@dataclass
class Tokens:
    """Token ids (``int64``, unpadded) of the prompt, the response and the whole."""

    prompt: np.ndarray | None = None
    response: np.ndarray | None = None
    full: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.prompt = _int_array("Tokens.prompt", self.prompt)
        self.response = _int_array("Tokens.response", self.response)
        self.full = _int_array("Tokens.full", self.full)
        if self.full is None and self.prompt is not None and self.response is not None:
            self.full = np.concatenate([self.prompt, self.response])

    def to_text(
        self, tokenizer: PreTrainedTokenizerBase, skip_special_tokens: bool = False
    ) -> Text:
        """Decode prompt, response and full, in one batch."""
        parts = (self.prompt, self.response, self.full)
        rows = [() if ids is None else ids for ids in parts]
        texts = TokenCodec(tokenizer).decode_many(rows, skip_special_tokens)
        return Text(
            *(None if ids is None else text for ids, text in zip(parts, texts, strict=True))
        )


@dataclass
class Masks:
    """Which tokens of ``full`` are real (attention) and which are the assistant's output."""

    all_attention_mask: np.ndarray | None = None
    all_assistant_mask: np.ndarray | None = None


@dataclass
class LogProbs:
    """Per-token log-probabilities over prompt, response and full (``float32``)."""

    prompt: np.ndarray | None = None
    response: np.ndarray | None = None
    full: np.ndarray | None = None


@dataclass
class ChatHistory:
    """Conversations: the prompt so far, the response turn(s), and the two together."""

    prompt: History | None = None
    response: History | None = None
    full: History | None = None

    def __post_init__(self) -> None:
        if self.full is None and self.prompt is not None and self.response is not None:
            self.full = self.prompt.copy().extend(self.response)

    def to_text(
        self, tokenizer: PreTrainedTokenizerBase | None = None, **template_kwargs: object
    ) -> Text:
        """Render with the chat template: the prompt gets the generation prompt."""
        prompt = full = None
        if self.prompt is not None:
            prompt = self.prompt.apply_chat_template(
                tokenizer, add_generation_prompt=True, **template_kwargs
            )
        if self.full is not None:
            full = self.full.apply_chat_template(tokenizer, **template_kwargs)
        response = None
        if prompt is not None and full is not None and full.startswith(prompt):
            response = full[len(prompt) :]
        return Text(prompt=prompt, response=response, full=full)

    def to_tokens(self, tokenizer: PreTrainedTokenizerBase, **template_kwargs: object) -> Tokens:
        """``to_text``, then ``Text.to_tokens``."""
        return self.to_text(tokenizer, **template_kwargs).to_tokens(tokenizer)
