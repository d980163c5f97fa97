"""Observations in, token ids out: how ``TransformersPolicy`` reads its inputs.

An observation is a ChatEnv ``dict`` keyed by input mode; a vector env's observation has a
tuple per key. Each conversation becomes an ``Encoded`` (its token ids, where the response
starts, which tokens are the assistant's); ``llm_gym.lm.left_pad`` batches them for the model.
Sampled token ids are used as given: nothing here decodes and re-tokenizes a response.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from llm_gym.chat.codec import TokenCodec
from llm_gym.chat.containers import Response
from llm_gym.chat.history import History

__all__ = ["Encoded", "Encoder", "split_observation", "split_responses"]


@dataclass
class Encoded:
    """One conversation as token ids.

    ``prompt_length`` is where the response starts (None when the input gives no split);
    ``assistant_mask`` marks the assistant's tokens (None when the input cannot tell).
    """

    ids: np.ndarray
    prompt_length: int | None = None
    assistant_mask: np.ndarray | None = None


def _is_message(value: Any) -> bool:
    return isinstance(value, Mapping)


def split_observation(obs: Any, input_mode: str) -> tuple[list[Any], bool]:
    """The per-conversation values under ``obs[input_mode]``, and whether ``obs`` was a batch."""
    if not isinstance(obs, Mapping):
        raise TypeError(
            f"obs must be a dict observation keyed by input mode (e.g. {{{input_mode!r}: ...}}), "
            f"got {type(obs).__name__}"
        )
    if input_mode not in obs:
        raise ValueError(
            f"obs has no {input_mode!r} key (the policy's input_mode); got keys {sorted(obs)}. "
            "Create the env with the same input_mode or observation_keys including it."
        )
    value = obs[input_mode]
    if input_mode == "history":
        if isinstance(value, History):
            return [value], False
        if isinstance(value, Sequence) and not isinstance(value, str):
            if len(value) == 0:
                raise ValueError("obs['history'] is empty: expected at least one message")
            if all(_is_message(m) for m in value):
                return [History(value)], False
            if all(isinstance(h, History) or _is_history_like(h) for h in value):
                return [h if isinstance(h, History) else History(h) for h in value], True
        raise TypeError(
            "obs['history'] must be a tuple of {'role', 'content'} dicts (or a tuple of such "
            f"tuples for a batch), got {_describe(value)}"
        )
    if input_mode == "text":
        if isinstance(value, str):
            return [value], False
        if isinstance(value, (list, tuple)) and value and all(isinstance(t, str) for t in value):
            return list(value), True
        raise TypeError(
            f"obs['text'] must be a str (or a tuple of str for a batch), got {_describe(value)}"
        )
    if isinstance(value, np.ndarray) and value.ndim == 2:
        return [_token_array("obs['tokens']", row) for row in value], True
    if isinstance(value, (list, tuple)) and value and not isinstance(value[0], (int, np.integer)):
        return [_token_array("obs['tokens']", row) for row in value], True
    return [_token_array("obs['tokens']", value)], False


def _is_history_like(value: Any) -> bool:
    return (
        isinstance(value, Sequence)
        and not isinstance(value, str)
        and len(value) > 0
        and all(_is_message(m) for m in value)
    )


def _describe(value: Any) -> str:
    if isinstance(value, (list, tuple)) and value:
        return f"{type(value).__name__} of {type(value[0]).__name__}"
    return type(value).__name__


def _token_array(name: str, value: Any) -> np.ndarray:
    array = np.asarray(value) if isinstance(value, (list, tuple, np.ndarray)) else None
    if array is None or array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
        described = (
            f"array of dtype {array.dtype} and shape {array.shape}"
            if array is not None
            else _describe(value)
        )
        raise TypeError(f"{name} must be a 1-D int64 array of token ids, got {described}")
    return array.astype(np.int64, copy=False)


def split_responses(responses: Any, n: int, batched: bool) -> list[Any]:
    """One response (or None) per conversation, checked against the observation's batch."""
    if responses is None:
        return [None] * n
    if not batched:
        return [responses]
    if not isinstance(responses, (list, tuple)):
        raise TypeError(
            f"responses must be a list with one response per observation ({n}) for a batched "
            f"observation, got {type(responses).__name__}"
        )
    if len(responses) != n:
        raise ValueError(
            f"responses must have one entry per observation: got {len(responses)} responses "
            f"for {n} observations"
        )
    return list(responses)


class Encoder:
    """Chat template and tokenizer settings shared by every conversation of a policy."""

    def __init__(self, tokenizer: Any, vocab_size: int, template_kwargs: Mapping[str, Any]):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.template_kwargs = dict(template_kwargs)
        self.codec = TokenCodec(tokenizer)

    def tokenize(self, text: str) -> np.ndarray:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return np.asarray(ids, dtype=np.int64)

    def render(self, history: History, *, generation_prompt: bool) -> dict[str, np.ndarray]:
        return history.apply_chat_template(
            self.tokenizer,
            add_generation_prompt=generation_prompt,
            return_assistant_tokens_mask=True,
            **self.template_kwargs,
        )

    def prompt(self, value: Any, *, assistant_mask: bool = False) -> Encoded:
        """A prompt to generate from (the generation prompt included)."""
        if isinstance(value, History):
            if not assistant_mask:
                ids = value.apply_chat_template(
                    self.tokenizer,
                    add_generation_prompt=True,
                    tokenize=True,
                    **self.template_kwargs,
                )
                return self._checked(Encoded(ids))
            rendered = self.render(value, generation_prompt=True)
            return self._checked(Encoded(rendered["input_ids"], None, rendered["assistant_masks"]))
        if isinstance(value, str):
            return self._checked(Encoded(self.tokenize(value)))
        return self._checked(Encoded(value))

    def prompts(self, values: Sequence[Any]) -> list[np.ndarray]:
        """``prompt(value).ids`` of each value, their texts tokenized in one batch."""
        texts: dict[int, str] = {}
        for i, value in enumerate(values):
            if isinstance(value, History):
                texts[i] = value.apply_chat_template(
                    self.tokenizer, add_generation_prompt=True, **self.template_kwargs
                )
            elif isinstance(value, str):
                texts[i] = value
        encoded = dict(zip(texts, self.codec.encode_many(list(texts.values())), strict=True))
        return [self._checked(Encoded(encoded.get(i, v))).ids for i, v in enumerate(values)]

    def scored(self, value: Any, response: Any) -> Encoded:
        """A conversation to score: prompt plus response, or a whole conversation."""
        if response is None:
            if isinstance(value, History):
                return self._checked(self._full_history(value))
            return self._checked(Encoded(self.prompt(value).ids))
        tokens = self._response_tokens(response)
        if tokens is None:  # text only: in history mode, the template closes the turn
            text = response.text if isinstance(response, Response) else response
            if isinstance(value, History):
                full = value.copy().append({"role": "assistant", "content": text})
                return self._checked(self._full_history(full))
            tokens = self.tokenize(text)
        prompt = self.prompt(value, assistant_mask=True)
        n = len(prompt.ids)
        mask = np.zeros(n + len(tokens), dtype=bool)
        if prompt.assistant_mask is not None:
            mask[:n] = prompt.assistant_mask
        mask[n:] = True
        return self._checked(Encoded(np.concatenate([prompt.ids, tokens]), n, mask))

    def _full_history(self, history: History) -> Encoded:
        rendered = self.render(history, generation_prompt=False)
        ids, mask = rendered["input_ids"], rendered["assistant_masks"]
        prompt_length = None
        if len(history) > 1 and history.roles[-1] == "assistant":
            # The response is the last assistant turn: what the full rendering adds to the
            # prompt rendered with its generation prompt.
            prompt_ids = self.render(history[:-1], generation_prompt=True)["input_ids"]
            if np.array_equal(ids[: len(prompt_ids)], prompt_ids):
                prompt_length = len(prompt_ids)
        return Encoded(ids, prompt_length, mask)

    def _response_tokens(self, response: Any) -> np.ndarray | None:
        if isinstance(response, Response):
            return response.tokens
        if isinstance(response, str):
            return None
        if isinstance(response, np.ndarray):
            return _token_array("response", response)
        raise TypeError(
            "each response must be a Response, a str or a 1-D int64 array of token ids, "
            f"got {type(response).__name__}"
        )

    def _checked(self, encoded: Encoded) -> Encoded:
        ids = encoded.ids
        if ids.size == 0:
            raise ValueError("a conversation encodes to 0 tokens: nothing to feed the model")
        if ids.min() < 0 or ids.max() >= self.vocab_size:
            raise ValueError(
                f"token ids must lie in [0, {self.vocab_size}) (the model's vocabulary), got "
                f"ids from {int(ids.min())} to {int(ids.max())}"
            )
        return encoded
