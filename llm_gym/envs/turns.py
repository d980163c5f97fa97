"""Token-in/token-out across turns: the prefix property, and the mask of the policy's tokens.

Each turn's prompt must be the previous prompt's tokens, then the tokens the policy sampled,
then what the env adds (the closing of the turn, tool messages, the next generation prompt).
A trainer scores the whole conversation in one forward and takes its loss on the policy's
tokens only, which is right only while that property holds; so it is checked every step.
"""

from __future__ import annotations

import numpy as np

__all__ = ["TokenPrefixError", "next_policy_mask"]


class TokenPrefixError(RuntimeError):
    """A turn's prompt tokens do not extend the previous prompt and the sampled response."""


def next_policy_mask(
    previous: np.ndarray, mask: np.ndarray, sampled: np.ndarray, new: np.ndarray
) -> tuple[np.ndarray | None, str | None]:
    """The mask of ``new`` (True on tokens the policy produced), or None and what broke.

    >>> prev, mask = np.array([1, 2]), np.zeros(2, bool)
    >>> next_policy_mask(prev, mask, np.array([3]), np.array([1, 2, 3, 9]))[0].tolist()
    [False, False, True, False]
    >>> next_policy_mask(prev, mask, np.array([3]), np.array([1, 2, 4, 9]))[1]
    'position 2 holds token 4 where the sampled response has token 3'
    """
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
