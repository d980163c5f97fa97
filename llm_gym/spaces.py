"""Gymnasium spaces for chat: any Unicode text, conversations, and token-id sequences."""

from __future__ import annotations

import string
from typing import TYPE_CHECKING

import numpy as np
from gymnasium import spaces

if TYPE_CHECKING:
    from numpy.typing import NDArray

__all__ = ["INPUT_MODES", "MAX_TEXT_LENGTH", "UnicodeText", "history_space", "token_space"]

# The observation keys a chat env can show: the conversation as messages, as the rendered
# prompt, or as that prompt's token ids.
INPUT_MODES = ("history", "text", "tokens")
MAX_TEXT_LENGTH = 1 << 20
# What sample() draws from: printable ASCII plus a few multi-byte characters and a newline,
# enough to exercise tokenizers without producing unreadable noise.
_SAMPLE_CHARSET = string.ascii_letters + string.digits + string.punctuation + " \n" + "éß’€中😀"
_SAMPLE_LENGTH = 64


class UnicodeText(spaces.Text):
    """A ``Text`` space of any Unicode string with ``min_length <= len(s) <= max_length``.

    Gymnasium's ``Text`` only admits its charset (alphanumerics by default); a chat message
    holds any script. This keeps ``Text``'s machinery, so ``batch_space``, vector envs and the
    env checker treat it as text.

    >>> space = UnicodeText(100)
    >>> space.contains("Hello, world! ¿Qué tal? 你好")
    True
    >>> space.contains(b"bytes")
    False
    """

    def __init__(
        self,
        max_length: int = MAX_TEXT_LENGTH,
        *,
        min_length: int = 0,
        seed: int | np.random.Generator | None = None,
    ) -> None:
        super().__init__(max_length, min_length=min_length, charset=_SAMPLE_CHARSET, seed=seed)

    def contains(self, x: object) -> bool:
        """Whether ``x`` is a ``str`` of an admitted length."""
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def sample(
        self,
        mask: tuple[int | None, NDArray[np.int8] | None] | None = None,
        probability: tuple[int | None, NDArray[np.float64] | None] | None = None,
    ) -> str:
        """A short string (at most 64 characters beyond ``min_length``) from a mixed charset:
        a uniform length up to ``max_length`` would be megabytes."""
        if mask is not None or probability is not None:
            return super().sample(mask=mask, probability=probability)
        high = min(self.max_length, self.min_length + _SAMPLE_LENGTH)
        length = int(self.np_random.integers(self.min_length, high + 1))
        chars = self.np_random.choice(np.array(list(_SAMPLE_CHARSET)), size=length)
        return "".join(chars.tolist())

    def __repr__(self) -> str:
        return f"UnicodeText({self.min_length}, {self.max_length})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, UnicodeText)
            and self.min_length == other.min_length
            and self.max_length == other.max_length
        )


def history_space(max_length: int = MAX_TEXT_LENGTH) -> spaces.Sequence:
    """A conversation: a tuple of ``{"role": str, "content": str}`` dicts."""
    message = spaces.Dict(
        {"role": UnicodeText(64, min_length=1), "content": UnicodeText(max_length)}
    )
    return spaces.Sequence(message, stack=False)


def token_space(vocab_size: int) -> spaces.Sequence:
    """A variable-length 1-D ``int64`` array of token ids in ``[0, vocab_size)``."""
    return spaces.Sequence(spaces.Discrete(vocab_size), stack=True)
