"""Observations in, token ids out: how ``TransformersPolicy`` reads its inputs (a ChatEnv
``dict`` keyed by input mode; a vector env's holds a tuple per key)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from llm_gym.chat.codec import TokenCodec
from llm_gym.chat.containers import Response
from llm_gym.chat.history import History
from llm_gym.checks import check_choice
from llm_gym.samplers import check_token_ids

# get_dist mask names; the second of each pair is TorchRL's name for the use case.
DIST_MASKS = {"prompt": "prompt", "sft": "prompt", "assistant": "assistant", "rlhf": "assistant"}
DIST_MASKS |= {"attention": "attention", "generic": "attention"}


@dataclass
class Encoded:
    """One conversation as token ids: ``prompt_length`` is where the response starts (None when
    the input gives no split); ``assistant_mask`` marks the assistant's tokens (None when the
    input cannot tell)."""

    ids: np.ndarray
    prompt_length: int | None = None
    assistant_mask: np.ndarray | None = None


def _messages(value: Any) -> bool:
    return (
        isinstance(value, Sequence)
        and not isinstance(value, str)
        and len(value) > 0
        and all(isinstance(m, Mapping) for m in value)
    )


def _describe(value: Any) -> str:
    if isinstance(value, (list, tuple)) and value:
        return f"{type(value).__name__} of {type(value[0]).__name__}"
    return type(value).__name__


def check_tokenizer(tokenizer: Any) -> None:
    """A ``TypeError`` unless ``tokenizer`` looks like a transformers tokenizer."""
    if tokenizer is None or not (callable(tokenizer) and hasattr(tokenizer, "decode")):
        raise TypeError(
            f"tokenizer must be a transformers tokenizer, got {type(tokenizer).__name__}"
        )


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
        if isinstance(value, History) or _messages(value):
            return [History(value) if not isinstance(value, History) else value], False
        if isinstance(value, (list, tuple)) and len(value) == 0:
            raise ValueError("obs['history'] is empty: expected at least one message")
        if isinstance(value, (list, tuple)) and all(
            isinstance(h, History) or _messages(h) for h in value
        ):
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
    rows = (isinstance(value, np.ndarray) and value.ndim == 2) or (
        isinstance(value, (list, tuple)) and value and not isinstance(value[0], (int, np.integer))
    )
    if rows:
        return [check_token_ids("obs['tokens']", row) for row in value], True
    return [check_token_ids("obs['tokens']", value)], False


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
        self.template_kwargs = {k: v for k, v in template_kwargs.items() if v is not None}
        self.codec = TokenCodec(tokenizer)

    def render(self, history: History, *, generation_prompt: bool) -> dict[str, np.ndarray]:
        """Token ids and assistant mask of ``history`` under the policy's template."""
        return history.apply_chat_template(
            self.tokenizer,
            add_generation_prompt=generation_prompt,
            return_assistant_tokens_mask=True,
            **self.template_kwargs,
        )

    def prompts(self, values: Sequence[Any]) -> list[np.ndarray]:
        """Token ids to generate from (generation prompt included); texts tokenized in a batch."""
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
        if response is not None and not isinstance(response, (Response, str, np.ndarray)):
            raise TypeError(
                "each response must be a Response, a str or a 1-D int64 array of token ids, "
                f"got {type(response).__name__}"
            )
        tokens = response.tokens if isinstance(response, Response) else None
        if isinstance(response, np.ndarray):
            tokens = check_token_ids("response", response)
        text = response.text if isinstance(response, Response) else response
        if isinstance(value, History) and tokens is None:
            # A whole conversation; a text response is its last turn, closed by the template.
            if response is not None:
                value = value.copy().append({"role": "assistant", "content": text})
            return self._checked(self._full_history(value))
        if response is None:
            return self._checked(Encoded(self._ids(value)))
        tokens = self.codec.encode(text) if tokens is None else tokens
        if isinstance(value, History):
            rendered = self.render(value, generation_prompt=True)
            prompt, mask = rendered["input_ids"], rendered["assistant_masks"]
        else:
            prompt = self._ids(value)
            mask = np.zeros(len(prompt), bool)
        mask = np.concatenate([mask, np.ones(len(tokens), bool)])
        return self._checked(Encoded(np.concatenate([prompt, tokens]), len(prompt), mask))

    def _ids(self, value: str | np.ndarray) -> np.ndarray:
        return self.codec.encode(value) if isinstance(value, str) else value

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

    def _checked(self, encoded: Encoded) -> Encoded:
        if encoded.ids.size == 0:
            raise ValueError("a conversation encodes to 0 tokens: nothing to feed the model")
        check_token_ids("a conversation (obs and responses)", encoded.ids, self.vocab_size)
        return encoded


def dist_mask(mask: Any, encoded: list[Encoded], attention: torch.Tensor) -> torch.Tensor:
    """The ``(B, T)`` bool mask ``mask`` names (or gives), in the padded layout of ``attention``."""
    batch, width = attention.shape
    if isinstance(mask, str):
        kind = DIST_MASKS[check_choice("mask", mask, DIST_MASKS)]
        if kind == "attention":
            return attention
        rows = []
        for i, enc in enumerate(encoded):
            if kind == "assistant" and enc.assistant_mask is None:
                raise ValueError(
                    f"mask='assistant' needs to know the assistant's tokens, unknown for "
                    f"conversation {i}: give history input or the responses"
                )
            if kind == "prompt" and enc.prompt_length is None:
                raise ValueError(
                    f"mask='prompt' needs to know where the response starts, unknown for "
                    f"conversation {i}: pass the prompt as obs and the responses separately"
                )
            prompt = np.arange(len(enc.ids)) >= (enc.prompt_length or 0)
            rows.append(enc.assistant_mask if kind == "assistant" else prompt)
        mask = rows
    if isinstance(mask, (list, tuple)):
        if len(mask) != batch:
            raise ValueError(
                f"mask must have one entry per conversation ({batch}), got {len(mask)}"
            )
        padded = np.zeros((batch, width), dtype=bool)
        for i, (row, enc) in enumerate(zip(mask, encoded, strict=True)):
            row = np.asarray(row)
            if row.shape != enc.ids.shape or row.dtype != bool:
                raise ValueError(
                    f"mask[{i}] must be a bool array of the conversation's length "
                    f"{len(enc.ids)}, got dtype {row.dtype} and shape {row.shape}"
                )
            padded[i, width - len(row) :] = row
        mask = padded
    mask = torch.as_tensor(mask, device=attention.device)
    if mask.dtype != torch.bool or mask.shape != (batch, width):
        raise ValueError(
            f"a custom mask must be bool with the padded shape {(batch, width)}, got dtype "
            f"{mask.dtype} and shape {tuple(mask.shape)}"
        )
    return mask & attention
