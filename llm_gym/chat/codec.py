"""``TokenCodec``: a tokenizer's encode and decode as envs and policies call them, in batches.

Through the transformers wrapper one text costs ~100 us of Python, more than a model's
forward per prompt at N=128 on a GPU. Here each batch is one call into the Rust tokenizer
(which spreads it over the cores), a text repeated in a batch (a GRPO group) is encoded once,
and so is the rendered system prompt every prompt starts with.

>>> from llm_gym.lm.loading import load_default_model
>>> codec = TokenCodec(load_default_model()[1])
>>> [ids.tolist() for ids in codec.encode_many(["Hi", "Hi", "Ho"])]
[[26843], [26843], [42654]]
>>> codec.decode_many([[26843], [42654, 2]])
['Hi', 'Ho']
>>> codec.end_of_turn(np.array([42654, 2]))
'<|im_end|>'
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["END_OF_TURN", "TokenCodec"]

# End-of-turn strings a sampled response may end with; they belong to the template's
# closing of the turn, not to the message content.
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|endoftext|>", "</s>")


class TokenCodec:
    """Batched, exact encode/decode of one tokenizer (same ids and text as the tokenizer's
    own ``encode``/``decode`` without special tokens added).

    ``backend`` is the Rust tokenizer (``tokenizers.Tokenizer``) that every batch goes
    through, None for a slow tokenizer; it may be replaced by an object with the same
    ``encode``/``encode_batch``/``decode``/``decode_batch`` methods, to observe the calls.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer)
        self.backend = getattr(tokenizer, "backend_tokenizer", None)
        # transformers' decode may clean up spaces afterwards; then only it gives its text.
        cleans_up = getattr(tokenizer, "clean_up_tokenization_spaces", False)
        self._rust_decode = self.backend is not None and not cleans_up
        self._end_ids = {}
        for end in END_OF_TURN:
            ids = tokenizer.convert_tokens_to_ids([end])
            if ids and isinstance(ids[0], int) and 0 <= ids[0] < self.vocab_size:
                if tokenizer.decode(ids, skip_special_tokens=False) == end:
                    self._end_ids[ids[0]] = end
        # The rendered system prompt: (text, ids, special tokens a rest may start with),
        # False where splitting there is not exact, None until set.
        self._prefix: tuple[str, np.ndarray, tuple[str, ...]] | bool | None = None

    @property
    def shared_prefix(self) -> str | None:
        """The text given to ``share_prefix`` when its ids are reused, else None."""
        return self._prefix[0] if isinstance(self._prefix, tuple) else None

    def encode(self, text: str) -> np.ndarray:
        """``int64`` ids of ``text``, no special tokens added."""
        return self.encode_many([text])[0]

    def encode_many(self, texts: Sequence[str]) -> list[np.ndarray]:
        """``encode`` of each text, in one batch; equal texts share one (read-only) array."""
        unique = list(dict.fromkeys(texts))
        head, head_ids, specials = (
            self._prefix if isinstance(self._prefix, tuple) else ("", None, ())
        )
        split = [t.startswith(head) and t[len(head) :].startswith(specials) for t in unique]
        rests = [t[len(head) :] if s else t for t, s in zip(unique, split, strict=True)]
        encoded = {}
        for text, s, ids in zip(unique, split, self._encode_batch(rests), strict=True):
            ids = np.concatenate([head_ids, ids]) if s else ids
            ids.setflags(write=False)
            encoded[text] = ids
        return [encoded[text] for text in texts]

    def share_prefix(self, text: str) -> None:
        """Encode ``text`` (a rendered system prompt that many prompts start with) once; only
        the first call counts. Exact when the rest of a prompt starts with a special token: a
        fast tokenizer splits the text at special tokens before anything else, so the two parts
        are encoded independently anyway. Checked here on ``text`` + each special token, which
        also catches tokenizers that treat the start of a text specially.
        """
        if self._prefix is not None:
            return
        self._prefix = False
        added = self.tokenizer.added_tokens_decoder.values() if self.backend is not None else ()
        specials = tuple(t.content for t in added if t.special and not t.lstrip)
        if not text or not specials:
            return
        probes = [text + special + "x\n" for special in specials]
        ids, *wholes = self._encode_batch([text, *probes])
        parts = self._encode_batch([probe[len(text) :] for probe in probes])
        if all(map(np.array_equal, wholes, (np.concatenate([ids, part]) for part in parts))):
            ids.setflags(write=False)
            self._prefix = (text, ids, specials)

    def _encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        if self.backend is None:
            out = self.tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
        elif len(texts) == 1:  # a batch call's thread pool costs more than one text
            out = [self.backend.encode(texts[0], add_special_tokens=False).ids]
        else:
            out = [e.ids for e in self.backend.encode_batch(texts, add_special_tokens=False)]
        return [np.asarray(ids, dtype=np.int64) for ids in out]

    def check_ids(self, tokens: np.ndarray) -> None:
        """Token ids the tokenizer can decode, or a ValueError naming the first bad one."""
        if tokens.size and (tokens.min() < 0 or tokens.max() >= self.vocab_size):
            bad = int(tokens[(tokens < 0) | (tokens >= self.vocab_size)][0])
            raise ValueError(f"action token ids must lie in [0, {self.vocab_size}), got {bad}")

    def decode_many(
        self, rows: Sequence[Sequence[int] | np.ndarray], skip_special_tokens: bool = True
    ) -> list[str]:
        """Each row's text (check the ids first: -1 would overflow in the tokenizer)."""
        lists = [np.asarray(row).tolist() for row in rows]
        skip = skip_special_tokens
        if not self._rust_decode:
            return [self.tokenizer.decode(ids, skip_special_tokens=skip) for ids in lists]
        if len(lists) == 1:  # as in _encode_batch
            return [self.backend.decode(lists[0], skip_special_tokens=skip)]
        return self.backend.decode_batch(lists, skip_special_tokens=skip)

    def end_of_turn(self, tokens: np.ndarray | None) -> str | None:
        """The end-of-turn string a sampled response ends with (its last token), if any."""
        return self._end_ids.get(int(tokens[-1])) if tokens is not None and len(tokens) else None
