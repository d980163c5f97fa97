"""``Conversation``: the immutable record of one episode, and ``PromptBuilder``, which starts
one from its first messages and extends one by a turn.

Extending a conversation never re-tokenizes a sampled response: the next prompt's tokens are
the previous prompt's, the sampled ids, then what the template and the env add (token-in,
token-out).

>>> from llm_gym.lm.loading import load_default_model
>>> builder = PromptBuilder(load_default_model()[1], need_tokens=True)
>>> (start,) = builder.start([History([{"role": "user", "content": "2+2?"}])])
>>> conversation, problem = builder.extend(start, "4", np.array([33, 2]), reward=1.0, version=3)
>>> conversation.rewards, conversation.versions, problem
((1.0,), (3,), None)
>>> int(conversation.policy_mask.sum())  # the two sampled tokens
2
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from llm_gym.chat.codec import TokenCodec
from llm_gym.chat.history import History
from llm_gym.chat.templates import CHAT_TEMPLATES, resolve_chat_template

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["Conversation", "PromptBuilder", "TokenPrefixError"]


@dataclass(frozen=True)
class Conversation:
    """One episode so far; never changed in place (``PromptBuilder.extend`` makes the next).

    - ``history``: the messages, the system prompt and first user turn included.
    - ``rendered`` / ``text``: the chat template's rendering with the generation prompt, and
      that plus the assistant prefix: the text prompt (None when nothing renders).
    - ``tokens``: the text prompt's token ids (read-only; None without a tokenizer).
    - ``policy_mask``: True on the tokens the policy sampled (the mask a trainer takes its
      loss on); None once text the env tokenized itself broke the token prefix.
    - ``rewards`` / ``versions``: per assistant turn, its reward and the policy version that
      produced it (None where unknown).
    - ``tool_calls`` / ``failed_tool_calls``: tool calls made and failed so far.
    - ``done``: the episode has ended (terminated or truncated).
    """

    history: History
    rendered: str | None = None
    text: str | None = None
    tokens: np.ndarray | None = None
    policy_mask: np.ndarray | None = None
    rewards: tuple[float, ...] = ()
    versions: tuple[int | None, ...] = ()
    tool_calls: int = 0
    failed_tool_calls: int = 0
    done: bool = False

    @property
    def turns(self) -> int:
        """Assistant turns so far."""
        return len(self.rewards)


class TokenPrefixError(RuntimeError):
    """A turn's prompt tokens do not extend the previous prompt and the sampled response."""


def _policy_mask_after(
    previous: np.ndarray, mask: np.ndarray, sampled: np.ndarray, new: np.ndarray
) -> tuple[np.ndarray | None, str | None]:
    """The mask of ``new`` (True on tokens the policy produced), or None and what broke."""
    expected = np.concatenate([previous, sampled])
    head = new[: len(expected)]
    if len(head) == len(expected) and np.array_equal(head, expected):
        rest = np.zeros(len(new) - len(expected), dtype=np.bool_)
        return np.concatenate([mask, np.ones(len(sampled), dtype=np.bool_), rest]), None
    differ = np.flatnonzero(head != expected[: len(head)])
    at = int(differ[0]) if len(differ) else len(head)
    what = "the previous prompt" if at < len(previous) else "the sampled response"
    got = f"token {int(new[at])}" if at < len(new) else "the end of the prompt"
    return None, f"position {at} holds {got} where {what} has token {int(expected[at])}"


class PromptBuilder:
    """Starts and extends conversations for one tokenizer, template and assistant role.

    Args:
        tokenizer: a transformers tokenizer, or None (history only: nothing renders).
        template_kwargs: passed to ``History.apply_chat_template`` (``chat_template_name``,
            ``chat_template``, ``tools``, ...).
        need_tokens: keep each prompt's token ids (tokens observations), else text only.
        assistant_prefix: text every assistant turn starts with; prompts end with it.
        policy_role: the assistant's role name.
        system_prompt: the system message every conversation starts with, if any: its
            rendering is tokenized once and shared by every prompt (checked exact).
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase | None,
        template_kwargs: Mapping[str, object] | None = None,
        *,
        need_tokens: bool = False,
        assistant_prefix: str = "",
        policy_role: str = "assistant",
        system_prompt: Mapping[str, str] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.template_kwargs = kwargs = dict(template_kwargs or {})
        self.codec = TokenCodec(tokenizer) if tokenizer is not None else None
        self.need_tokens = need_tokens and tokenizer is not None
        self.assistant_prefix, self.policy_role = assistant_prefix, policy_role
        self._system = system_prompt
        # The built-in templates close an assistant turn with the same text whatever came
        # before, so that closing is rendered once; other templates are rendered in full.
        names = kwargs.get("chat_template_name"), kwargs.get("chat_template")
        self._fixed_closing = tokenizer is not None and (
            resolve_chat_template(tokenizer, *names) in CHAT_TEMPLATES.values()
        )
        self._closing: str | None = None
        self._closing_ids: dict[str, np.ndarray] = {}
        # Every prompt ends with the assistant prefix's tokens: the turn starts with it.
        self._prefix_ids = self.codec.encode(assistant_prefix) if self.need_tokens else None

    def start(self, histories: Sequence[History]) -> list[Conversation]:
        """A conversation for each history, their prompts tokenized in one batch."""
        if self.tokenizer is None:
            return [Conversation(history) for history in histories]
        rendered = [self.render(history) for history in histories]
        tokens = self._encode(rendered) if self.need_tokens else [None] * len(histories)
        conversations = []
        for history, text, ids in zip(histories, rendered, tokens, strict=True):
            mask = None if ids is None else np.zeros(len(ids), np.bool_)
            conversations.append(
                Conversation(history, text, text + self.assistant_prefix, ids, mask)
            )
        return conversations

    def render(self, history: History) -> str:
        """``history`` with the chat template and the generation prompt."""
        return history.apply_chat_template(
            self.tokenizer, add_generation_prompt=True, **self.template_kwargs
        )

    def extend(
        self,
        conversation: Conversation,
        content: str,
        tokens: np.ndarray | None,
        added: Sequence[Mapping[str, str]] = (),
        *,
        reward: float = 0.0,
        version: int | None = None,
        tool_calls: tuple[int, int] | None = None,
        done: bool = False,
    ) -> tuple[Conversation, str | None]:
        """``conversation`` after the policy's turn (``content``, sampled as ``tokens`` or
        None for text the env tokenizes itself) and the messages the env ``added`` (tool
        results), and what broke the token prefix (None: nothing); ``tool_calls`` are the new
        (made, failed) totals."""
        prefix = self.assistant_prefix
        turn = prefix + content
        history = conversation.history.copy().append({"role": self.policy_role, "content": turn})
        history.extend(added)
        made, failed = tool_calls or (conversation.tool_calls, conversation.failed_tool_calls)
        record = {
            "rewards": (*conversation.rewards, float(reward)),
            "versions": (*conversation.versions, version),
            "tool_calls": made,
            "failed_tool_calls": failed,
            "done": done,
        }
        if self.tokenizer is None:
            return Conversation(history, **record), None
        body = conversation.rendered + turn
        if self._closing is not None and not added:
            rendered, closing = body + self._closing, self._closing
        else:
            rendered = self.render(history)
            # What the template adds after the response (closing the turn, opening the next);
            # None for a template that rewrites earlier turns: only its full rendering is right.
            closing = rendered[len(body) :] if rendered.startswith(body) else None
            if closing is not None and self._fixed_closing and not added:
                self._closing = closing
        if conversation.tokens is None:
            return Conversation(history, rendered, rendered + prefix, **record), None
        sampled = tokens is not None
        if not sampled:  # text given as a str is kept as said, its tokens too
            tokens = self.codec.encode(content)
        if closing is None:
            ids = self._encode([rendered])[0]
        else:
            # A sampled response ends with the end-of-turn token the template would add: it
            # is not added twice.
            end = self.codec.end_of_turn(tokens) if sampled else None
            if end is not None and closing.startswith(end):
                closing = closing[len(end) :]
            closing_ids = self._closing_ids.get(closing)
            if closing_ids is None:
                closing_ids = self.codec.encode(closing)
                if not added:  # tool output varies: not worth a cache entry
                    self._closing_ids[closing] = closing_ids
            ids = np.concatenate([conversation.tokens, tokens, closing_ids, self._prefix_ids])
            ids.setflags(write=False)
        mask, problem = None, None
        if conversation.policy_mask is not None:
            mask, problem = _policy_mask_after(
                conversation.tokens, conversation.policy_mask, tokens, ids
            )
        extended = Conversation(history, rendered, rendered + prefix, ids, mask, **record)
        return extended, problem if sampled else None  # text the env tokenized: nothing to keep

    def _encode(self, rendered: Sequence[str]) -> list[np.ndarray]:
        """The token ids of rendered prompts, each followed by the assistant prefix's."""
        if self._system is not None:  # tokenized on the first call only
            head = History([self._system]).apply_chat_template(
                self.tokenizer, **self.template_kwargs
            )
            self.codec.share_prefix(head)
            self._system = None
        return [np.concatenate([ids, self._prefix_ids]) for ids in self.codec.encode_many(rendered)]
