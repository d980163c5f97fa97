"""``Source``, where task items come from, and ``Shard``, which part of a stream one serves."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np

from llm_gym.checks import check_int

__all__ = ["Shard", "Source"]


@runtime_checkable
class Source(Protocol):
    """Where a task's items come from: a dataset split, a generator, an iterable.

    A source serves one seeded stream of items (``next_item``); ``for_shard(shard)`` gives a
    source over the same items and seed that serves ``shard`` of the stream, which is how the
    sub-envs of a vector env split an epoch exactly once. Sources with difficulty levels also
    have ``level``, ``num_levels`` and ``set_level`` (shared with those shards).

    ``copy.copy(source)`` is where a forked env's stream goes on from (``ChatEnv.fork``): the
    same data and position, nothing mutable shared with the original, so the two serve the
    same items independently (a source that cannot, an iterable's, says so in its docstring).
    """

    def next_item(self) -> Mapping[str, Any]:
        """The next item of this source's shard of the stream."""
        ...

    def reseed(self, seed: int | None) -> None:
        """Restart from the first item of the order ``seed`` defines (a fresh one if None)."""
        ...

    def rewind(self) -> None:
        """Restart from the first item of the current seed's order."""
        ...

    def for_shard(self, shard: Shard) -> Source:
        """A source over the same items and seed that serves ``shard`` of the stream."""
        ...


class Shard:
    """Which items of one seeded stream a source serves, and how often each.

    The stream serves every item ``repeats`` times in a row. A source with shard
    ``(index, count)`` serves stream positions ``index, index + count, index + 2 * count, ...``:
    ``count`` sources with indices ``0 .. count - 1`` (a vector env's sub-envs, the ranks of a
    data-parallel run) together serve every item exactly ``repeats`` times per epoch; with
    ``count`` a multiple of ``repeats``, an item's copies go to consecutive sources at once.

    >>> shard = Shard(index=1, count=2, repeats=2)
    >>> [shard.item_index(k) for k in range(4)]  # stream positions 1, 3, 5, 7
    [0, 1, 2, 3]
    """

    def __init__(self, index: int = 0, count: int = 1, repeats: int = 1) -> None:
        self.index, self.count, self.repeats = index, count, repeats

    @classmethod
    def parse(cls, shard: object, repeats: int = 1) -> Shard:
        """Checks a user's ``shard=(index, count)`` (None: the whole stream)."""
        if shard is None:
            return cls(0, 1, repeats)
        if (
            not isinstance(shard, (tuple, list))
            or len(shard) != 2
            or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in shard)
            or not 0 <= shard[0] < shard[1]
        ):
            raise ValueError(
                f"shard must be None or (index, count) with ints 0 <= index < count, got {shard!r}"
            )
        return cls(int(shard[0]), int(shard[1]), repeats)

    def item_index(self, k: int) -> int:
        """The stream index of the item that this source's ``k``-th item is."""
        return (self.index + k * self.count) // self.repeats


class _SeededSource:
    """The seed and position of a source whose order is a function of its seed; subclasses
    restart their own state in ``rewind``."""

    seed: int
    _position: int

    @property
    def position(self) -> int:
        """How many items were served since the last reseed or rewind."""
        return self._position

    def reseed(self, seed: int | None) -> None:
        """Restart from the first item of the order ``seed`` defines (a fresh one if None)."""
        seed = check_int("seed", seed, 0, optional=True)
        self.seed = int(np.random.SeedSequence().entropy % 2**63) if seed is None else seed
        self.rewind()  # the subclass's

    def seek(self, position: int) -> None:
        """Serve from the item at ``position`` of this source's shard of the current seed's
        stream next, as if ``position`` items had been served (how a run resumes)."""
        position = check_int("position", position, 0)
        self.rewind()
        self._position = position
