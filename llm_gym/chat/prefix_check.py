"""Whether a chat template keeps earlier turns' tokens when a turn is added: what a trainer of
multi-turn episodes needs, since each turn's prompt must be the previous prompt, the tokens
the policy sampled and what the environment said, token for token (``TokenPrefixError``
otherwise). ``check_prefix`` plays a scripted conversation through the env's own
``PromptBuilder``: after each turn it renders the whole conversation anew (as an env does
with a template it does not know) and takes the sampled tokens forward where the template
kept the earlier text, else tokenizes the new text and compares. It is the check a training
run meets at its first multi-turn episode, as a command to run before
(``llm-gym check-template``). llm_gym's built-in templates are written to keep the text.

Templates that rewrite earlier turns break it: ones that drop an earlier assistant turn's
reasoning (``<think>...</think>``), or put the system prompt into the last user message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from llm_gym.chat.conversation import PromptBuilder
from llm_gym.chat.history import History

if TYPE_CHECKING:
    from collections.abc import Sequence

    from transformers import PreTrainedTokenizerBase

__all__ = ["PrefixCheck", "SCRIPT", "check_prefix"]

# The scripted game: a user's opening, then the assistant's moves and the user's answers.
SCRIPT = (
    "Guess the number between 1 and 20. Answer with your guess in brackets, like [7].",
    ("I will start in the middle. [10]", "The target number is higher."),
    ("Then halfway up. [15]", "The target number is lower."),
    ("Between them. [12]", "The target number is higher."),
    ("So it is [13]", "Correct, you win."),
)


@dataclass(frozen=True)
class PrefixCheck:
    """What ``check_prefix`` found: whether every prompt began with the previous prompt
    and its sampled response (``keeps``), over how many ``turns``, and where it first did not:
    the turn whose next prompt changed (``turn``, 1-based) and what changed (``detail``)."""

    keeps: bool
    turns: int
    turn: int | None = None
    detail: str | None = None


def check_prefix(
    tokenizer: PreTrainedTokenizerBase,
    *,
    chat_template: str | None = None,
    chat_template_name: str | None = None,
    turns: int = 4,
    system_prompt: str | None = None,
    script: Sequence = SCRIPT,
) -> PrefixCheck:
    """Play ``turns`` turns of ``script`` (after ``system_prompt``, if given) with the template
    (``chat_template``'s text, ``chat_template_name``'s built-in, else the one llm_gym picks
    for ``tokenizer``): each
    response sampled as its text's tokens and the end-of-turn token the template closes an
    assistant turn with; after each turn the conversation is rendered whole and tokenized,
    and must begin with the previous prompt's tokens and the response's.

    >>> from llm_gym.lm.loading import load_gpt2_tokenizer
    >>> check_prefix(load_gpt2_tokenizer(), chat_template_name="llama", turns=2)
    PrefixCheck(keeps=True, turns=2, turn=None, detail=None)
    """
    if not 1 <= turns < len(script):
        raise ValueError(f"turns must be 1 to {len(script) - 1}, got {turns!r}")
    options = {"chat_template": chat_template, "chat_template_name": chat_template_name}
    builder = PromptBuilder(tokenizer, options, need_tokens=True)
    codec = builder.codec
    system = [] if system_prompt is None else [{"role": "system", "content": system_prompt}]
    opening = History([*system, {"role": "user", "content": script[0]}])
    conversation = builder.start([opening])[0]
    end = _end_of_turn(tokenizer, codec, options)
    for turn in range(1, turns + 1):
        said, answer = script[turn]
        sampled = np.concatenate([codec.encode(said), end])
        before = np.concatenate([conversation.tokens, sampled])
        conversation, problem = builder.extend(
            conversation, said, sampled, [{"role": "user", "content": answer}]
        )
        if problem is not None:
            detail = _shown(tokenizer, problem, conversation.tokens, before)
            return PrefixCheck(False, turns, turn, detail)
    return PrefixCheck(True, turns)


def _end_of_turn(
    tokenizer: PreTrainedTokenizerBase, codec: Any, options: dict[str, str | None]
) -> np.ndarray:
    # The token a model ends its turn with: the template's closing of an assistant turn,
    # where it starts with a known end-of-turn token, else the end-of-sequence token.
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "MARK"}]
    text = History(messages).apply_chat_template(tokenizer, **options)
    closing = codec.encode(text.split("MARK", 1)[1]) if "MARK" in text else np.zeros(0, int)
    if len(closing) and codec.end_of_turn(closing[:1]) is not None:
        return closing[:1]
    eos = tokenizer.eos_token_id
    return np.array([] if eos is None else [eos], dtype=np.int64)


def _shown(
    tokenizer: PreTrainedTokenizerBase, problem: str, now: np.ndarray, was: np.ndarray
) -> str:
    # The problem, with the text around the first changed token in both renderings.
    at = next(
        (i for i, (a, b) in enumerate(zip(now, was, strict=False)) if a != b),
        min(len(now), len(was)),
    )
    before = tokenizer.decode(was[max(at - 8, 0) : at + 8].tolist())
    after = tokenizer.decode(now[max(at - 8, 0) : at + 8].tolist())
    return f"{problem}: the conversation read {before!r} there, the longer one reads {after!r}"
