"""What ``ChatEnv`` accepts, checked once: its observation keys and each action.

Every action (``ChatEnv``'s Action Space says what it may be) becomes a ``Response`` here,
or a clear error that names what was expected and what came: model output is hostile input.

>>> observation_keys_for("tokens", None, tools=["python"], tokenizer=object())
('tokens', 'policy_mask')
>>> check_action("4", None, "history", 100)
Response(text='4', tokens=None, log_probs=None, version=None)
>>> turn_content(Response("4<|im_end|>", np.array([19, 2])), None)
'4'
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from llm_gym.chat.codec import END_OF_TURN, TokenCodec
from llm_gym.chat.containers import Response
from llm_gym.checks import check_choice
from llm_gym.spaces import INPUT_MODES

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["check_action", "decode_token_actions", "observation_keys_for", "turn_content"]

MASK_KEY = "policy_mask"  # observation key: 1 on the prompt tokens the policy sampled


def observation_keys_for(
    input_mode: str,
    observation_keys: Sequence[str] | None,
    tools: Sequence[object] | None,
    tokenizer: PreTrainedTokenizerBase | None,
) -> tuple[str, ...]:
    """``observation_keys`` or ``(input_mode,)``, checked, plus the policy mask with tools in
    tokens mode (a multi-turn trainer needs it)."""
    check_choice("input_mode", input_mode, INPUT_MODES)
    if isinstance(observation_keys, str):
        raise TypeError(
            f"observation_keys must be a tuple of input modes, e.g. ({observation_keys!r},), "
            f"got the str {observation_keys!r}"
        )
    keys = tuple(observation_keys) if observation_keys is not None else (input_mode,)
    for key in keys:
        if key not in (*INPUT_MODES, MASK_KEY):
            raise ValueError(
                f"observation_keys must be among {(*INPUT_MODES, MASK_KEY)}, got {key!r}"
            )
    if MASK_KEY in keys and "tokens" not in keys:
        raise ValueError(f"observation key {MASK_KEY!r} marks tokens: add 'tokens', got {keys}")
    if tools and "tokens" in keys and MASK_KEY not in keys:
        keys = (*keys, MASK_KEY)
    if tokenizer is None and any(key != "history" for key in keys):
        mode = next(key for key in keys if key != "history")
        raise ValueError(
            f"input_mode {mode!r} needs tokenizer= (a transformers tokenizer, to render "
            "the chat template and tokenize), got tokenizer=None"
        )
    return keys


class _Decoded(Response):
    """A Response this module decoded from token ids itself: its text agrees with its tokens
    by construction, so ``check_action`` does not decode them again."""


def check_action(
    action: object, codec: TokenCodec | None, input_mode: str, max_text_length: int
) -> Response:
    """The action as a ``Response``, or a clear error naming what was expected.

    With a ``codec`` (the env has a tokenizer), a Response or dict carrying both text and
    tokens must have the text its tokens decode to, with or without special tokens (what a
    policy's ``decode`` gives): the reward reads the text and the trainer learns from the
    tokens, so the two must be one response. A mismatch is a ValueError naming both.
    """
    if isinstance(action, Response):
        response = action
    elif isinstance(action, str):
        response = Response(action)
    elif isinstance(action, Mapping):
        response = Response.from_mapping(dict(action))
    elif _is_token_ids(action):
        if action.ndim != 1:
            raise ValueError(f"a token action must be 1-D, got shape {action.shape}")
        if codec is None:
            raise ValueError("a token-id action needs ChatEnv(tokenizer=...), got None")
        codec.check_ids(action)  # before decoding: -1 would overflow in the tokenizer
        response = _Decoded(codec.decode_many([action])[0], action)
    else:
        expected = "an int64 array of token ids" if input_mode == "tokens" else "a str"
        raise TypeError(
            f"action must be {expected}, a Response or a dict with 'text', "
            f"got {type(action).__name__}"
        )
    if codec is not None and response.tokens is not None:
        codec.check_ids(response.tokens)
        if not isinstance(response, _Decoded):
            _check_agreement(response.text, response.tokens, codec)
    text = response.text
    if len(text) > max_text_length:
        raise ValueError(
            f"action text has {len(text)} characters, more than max_text_length="
            f"{max_text_length} (the action space's bound)"
        )
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(
            f"action text is not valid Unicode: {error.reason} ({text[error.start]!r} at "
            f"character {error.start}); it cannot be tokenized or stored"
        ) from None
    return response


def _check_agreement(text: str, tokens: np.ndarray, codec: TokenCodec) -> None:
    """A ValueError unless ``text`` is what ``tokens`` decode to, with special tokens (as the
    policies decode) or without (as the env decodes a token-id action)."""
    decoded = codec.decode_many([tokens], skip_special_tokens=False)[0]
    if text == decoded or text == codec.decode_many([tokens])[0]:
        return
    at = len(os.path.commonprefix([text, decoded]))
    start = max(at - 20, 0)
    raise ValueError(
        f"Response.text does not match Response.tokens: from character {at} the text reads "
        f"{text[start : at + 40]!r} but its {len(tokens)} tokens decode to "
        f"{decoded[start : at + 40]!r} (text of {len(text)} characters, decoded "
        f"{len(decoded)}). The reward reads the text and training reads the tokens: pass "
        "the text decoded from the tokens, or tokens=None to have the text tokenized"
    )


def turn_content(response: Response, codec: TokenCodec | None) -> str:
    """The turn's content: the text as said, less the end-of-turn token a sampled response
    ends with (that token closes the turn; it is not part of what was said)."""
    text, tokens = response.text, response.tokens
    if tokens is None or not len(tokens):
        return text
    ends = END_OF_TURN if codec is None else (codec.end_of_turn(tokens),)
    end = next((end for end in ends if end and text.endswith(end)), None)
    return text[: -len(end)] if end else text


def decode_token_actions(actions: Sequence[Any], codec: TokenCodec | None) -> list[Any]:
    """``actions`` with each 1-D integer array as its ``Response``, all decoded in one batch;
    other actions as given (``check_action`` reads them)."""
    out = list(actions)
    arrays = [i for i, action in enumerate(out) if _is_token_ids(action) and action.ndim == 1]
    if not arrays or codec is None:
        return out
    for i in arrays:
        try:  # before decoding: -1 would overflow in the tokenizer
            codec.check_ids(out[i])
        except ValueError as err:
            raise ValueError(f"actions[{i}]: {err}") from None
    for i, text in zip(arrays, codec.decode_many([out[i] for i in arrays]), strict=True):
        out[i] = _Decoded(text, out[i])
    return out


def _is_token_ids(action: Any) -> bool:
    return isinstance(action, np.ndarray) and np.issubdtype(action.dtype, np.integer)
