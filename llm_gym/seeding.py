"""Seeds derived from a key of ints through numpy's ``SeedSequence``: keys that differ
anywhere give independent seeds, and the same key the same seed on every machine.

>>> derive_seed(0, 1)
3964924996
>>> derive_seeds(0, 1, count=2)
[3964924996, 1358922860]
>>> derive_seed(0, 1, bits=64) == 3964924996 << 32 | 1358922860
True
"""

from __future__ import annotations

import numpy as np

__all__ = ["derive_seed", "derive_seeds"]


def derive_seeds(*key: int, count: int, bits: int = 32) -> list[int]:
    """``count`` seeds of ``bits`` bits (32 or 64) derived from ``key``: the first words of
    ``SeedSequence(key)``'s state, a 64-bit seed made of two (the high word first)."""
    if bits not in (32, 64):
        raise ValueError(f"bits must be 32 or 64, got {bits!r}")
    words = np.random.SeedSequence(list(key)).generate_state(count * bits // 32, np.uint32)
    if bits == 32:
        return [int(word) for word in words]
    return [int(high) << 32 | int(low) for high, low in zip(words[::2], words[1::2], strict=True)]


def derive_seed(*key: int, bits: int = 32) -> int:
    """One seed of ``bits`` bits (32 or 64) derived from ``key``: ``derive_seeds``'s first."""
    return derive_seeds(*key, count=1, bits=bits)[0]
