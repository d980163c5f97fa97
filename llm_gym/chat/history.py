"""``History``: one conversation as a list of ``{"role", "content"}`` messages."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from llm_gym.chat.templates import has_generation_markers, resolve_chat_template
from llm_gym.checks import check_str

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["History", "Message"]

Message = dict[str, Any]

# Stands in for an unterminated last message so the template renders its header, then the
# text is cut where the sentinel starts: no template needs to know about incomplete turns.
_SENTINEL = "\x00llm_gym-incomplete\x00"


def _as_message(message: Any) -> Message:
    role = content = None
    if isinstance(message, Mapping):
        role, content = message.get("role"), message.get("content")
    if not isinstance(role, str) or not isinstance(content, str):
        got = f"role={type(role).__name__}, content={type(content).__name__}"
        got = got if isinstance(message, Mapping) else type(message).__name__
        raise TypeError(f"message must be a mapping with str 'role' and 'content', got {got}")
    out: Message = {"role": role, "content": content}
    if message.get("is_complete", True) is False:
        out["is_complete"] = False
    return out


class History:
    """One conversation: an ordered list of messages, each ``{"role": str, "content": str}``.

    A message may also carry ``"is_complete": False`` when it was read from text that ends
    before its end-of-turn marker (a response cut off mid-generation).

    >>> h = History.from_chats([{"role": "user", "content": "hi"}])
    >>> h.append({"role": "assistant", "content": "hello"}).roles
    ['user', 'assistant']
    >>> [m["content"] for m in h]
    ['hi', 'hello']
    """

    def __init__(self, messages: Iterable[Mapping[str, Any]] = ()) -> None:
        self._messages: list[Message] = [_as_message(m) for m in messages]

    @classmethod
    def from_chats(
        cls, chats: Sequence[Mapping[str, Any]] | Sequence[Sequence[Mapping[str, Any]]]
    ) -> History | list[History]:
        """A History from a list of message dicts, or a list of Histories from a list of lists."""
        if len(chats) > 0 and not isinstance(chats[0], Mapping):
            return [cls(chat) for chat in chats]
        return cls(chats)

    def append(self, message: Mapping[str, Any]) -> History:
        """Append one message in place and return ``self``, so calls chain."""
        self._messages.append(_as_message(message))  # not via extend: a reset's hot path
        return self

    def extend(self, messages: Iterable[Mapping[str, Any]]) -> History:
        """Append several messages (or another History) in place and return ``self``."""
        self._messages.extend([_as_message(m) for m in messages])
        return self

    def copy(self) -> History:
        """A new History with the same messages (checked and never changed: shared)."""
        other = History()
        other._messages = list(self._messages)
        return other

    def __iter__(self) -> Iterator[Message]:
        return (dict(m) for m in self._messages)

    def __len__(self) -> int:
        return len(self._messages)

    def __getitem__(self, index: int | slice) -> Message | History:
        if isinstance(index, slice):
            return History(self._messages[index])
        return dict(self._messages[index])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, History) and self._messages == other._messages

    def __repr__(self) -> str:
        return f"History({self._messages!r})"

    @property
    def roles(self) -> list[str]:
        """Each message's role, in order."""
        return [m["role"] for m in self._messages]

    @property
    def contents(self) -> list[str]:
        """Each message's content, in order."""
        return [m["content"] for m in self._messages]

    @property
    def is_complete(self) -> bool:
        """False when the last message was cut off before its end-of-turn marker."""
        return not self._messages or self._messages[-1].get("is_complete", True)

    def to_chats(self) -> tuple[dict[str, str], ...]:
        """Fresh ``{"role", "content"}`` dicts: the form of a ``"history"`` observation."""
        return tuple({"role": m["role"], "content": m["content"]} for m in self._messages)

    def apply_chat_template(
        self,
        tokenizer: PreTrainedTokenizerBase | None = None,
        *,
        add_generation_prompt: bool = False,
        tokenize: bool = False,
        return_assistant_tokens_mask: bool = False,
        chat_template_name: str | None = None,
        chat_template: str | None = None,
        **template_kwargs: object,
    ) -> str | np.ndarray | dict[str, np.ndarray]:
        """Render the conversation with a chat template.

        Returns the text; with ``tokenize=True`` its token ids (``int64``); with
        ``return_assistant_tokens_mask=True`` a dict of ``input_ids``, ``attention_mask`` and
        ``assistant_masks`` (bool, True on the assistant's content and end-of-turn tokens;
        found by the contents' character offsets for a template without generation markers).

        >>> h = History.from_chats([{"role": "user", "content": "2+2?"}])
        >>> h.apply_chat_template(chat_template_name="chatml_format", add_generation_prompt=True)
        '<|im_start|>user\\n2+2?<|im_end|>\\n<|im_start|>assistant\\n'
        """
        if (tokenize or return_assistant_tokens_mask) and tokenizer is None:
            raise ValueError("tokenizer is required to tokenize a History, got None")
        template = resolve_chat_template(tokenizer, chat_template_name, chat_template)
        messages = list(self.to_chats())
        cut = None
        if not self.is_complete:
            cut, messages[-1]["content"] = messages[-1]["content"], _SENTINEL
            add_generation_prompt = False
        marked = return_assistant_tokens_mask and has_generation_markers(template)
        # Imported here: rendering needs a tokenizer, so transformers is loaded already.
        from transformers.utils.chat_template_utils import render_jinja_template

        rendered, indices = render_jinja_template(
            conversations=[messages],
            chat_template=template,
            add_generation_prompt=add_generation_prompt,
            return_assistant_tokens_mask=marked,
            **{**(getattr(tokenizer, "special_tokens_map", None) or {}), **template_kwargs},
        )
        text, at = rendered[0], None
        if cut is not None:
            at = text.index(_SENTINEL)
            text = text[:at] + cut
        if not tokenize and not return_assistant_tokens_mask:
            return text
        enc = tokenizer(
            text, add_special_tokens=False, return_offsets_mapping=return_assistant_tokens_mask
        )
        ids = np.asarray(enc["input_ids"], dtype=np.int64)
        if not return_assistant_tokens_mask:
            return ids
        if marked:
            spans = [(s, min(e, len(text))) for s, e in indices[0] if at is None or s <= at]
        else:  # no markers: each assistant message's content, found left to right
            spans, pos = [], 0
            for message in self._messages:
                found = text.find(message["content"], pos)
                if found < 0:
                    continue
                pos = found + len(message["content"])
                if message["role"] == "assistant":
                    spans.append((found, pos))
        offsets = np.asarray(enc["offset_mapping"], dtype=np.int64).reshape(-1, 2)
        mask = np.zeros(len(ids), dtype=bool)
        for start, end in spans:
            mask |= (offsets[:, 0] < end) & (offsets[:, 1] > start)
        return {
            "input_ids": ids,
            "attention_mask": np.ones(len(ids), dtype=np.int64),
            "assistant_masks": mask,
        }

    @classmethod
    def from_text(
        cls,
        text: str,
        chat_template_name: str | None = "chatml_format",
        chat_template: str | None = None,
    ) -> History:
        """Parse a rendered conversation back into a History.

        A last message with no end-of-turn marker (text cut off mid-generation, or a bare
        generation prompt) is kept with ``is_complete=False``.

        >>> h = History.from_text("<|im_start|>user\\nhi<|im_end|>\\n<|im_start|>assistant\\nHel")
        >>> h.roles, h.contents, h.is_complete
        (['user', 'assistant'], ['hi', 'Hel'], False)
        """
        check_str("text", text)
        template = resolve_chat_template(None, chat_template_name, chat_template)
        if "<|start_header_id|>" in template:
            header, end_of_turn = "<|start_header_id|>", "<|eot_id|>"
            role_end, text = "<|end_header_id|>\n\n", text.removeprefix("<|begin_of_text|>")
        elif "<|im_start|>" in template:
            header, role_end, end_of_turn = "<|im_start|>", "\n", "<|im_end|>"
        else:
            raise ValueError(
                "from_text knows the chatml, qwen and llama formats; chat_template matches none"
            )
        # A message is its header, role and content, up to its end of turn, or for one cut
        # off, up to the next header or the end of the text.
        h, e = re.escape(header), re.escape(end_of_turn)
        pattern = re.compile(rf"{h}(\w+){re.escape(role_end)}(.*?)({e}|(?={h})|\Z)", re.DOTALL)
        matches = pattern.findall(text)
        return cls(
            {"role": r, "content": c, "is_complete": e == end_of_turn} for r, c, e in matches
        )
