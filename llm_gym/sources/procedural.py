"""``ProceduralSource``: items generated on demand, seeded, at a difficulty level."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llm_gym.checks import check_int
from llm_gym.sources.base import Shard, _SeededSource

__all__ = ["ProceduralSource"]

Generate = Callable[[int, int, int], dict[str, Any]]


class ProceduralSource(_SeededSource):
    """Serves ``generate(seed, index, level)`` for ``index = 0, 1, 2, ...``.

    The same seed gives the same items in every process; there are no epochs (every item
    is new). Forks (the sub-envs of one vector env) share the seed and the level and serve
    their own ``Shard`` of the indices, so a curriculum that raises the level raises it for
    all of them.

    Args:
        generate: builds one item (a dict with at least a ``"query"``).
        num_levels: how many difficulty levels there are (``0 .. num_levels - 1``).
        level: the level to start at.
        seed: the items' seed (None: a fresh random one, until ``reseed``).
        shard: which indices this source serves, each how often (default: all, once).

    >>> source = ProceduralSource(lambda seed, i, level: {"query": f"{seed}:{i}:{level}"},
    ...                           num_levels=3, level=1, seed=7)
    >>> fork = source.for_shard(Shard(index=1, count=2))
    >>> [source.next_item()["query"] for _ in range(2)]
    ['7:0:1', '7:1:1']
    >>> source.set_level(2)
    >>> [fork.next_item()["query"] for _ in range(2)]
    ['7:1:2', '7:3:2']
    """

    def __init__(
        self,
        generate: Generate,
        *,
        num_levels: int,
        level: int,
        seed: int | None = None,
        shard: Shard | None = None,
    ) -> None:
        if not callable(generate):
            raise TypeError(f"generate must be callable, got {type(generate).__name__}")
        self.generate, self.num_levels = generate, check_int("num_levels", num_levels, 1)
        self._level = [check_int("level", level, 0, num_levels - 1)]  # shared with the shards
        self.shard = shard or Shard()
        self.reseed(seed)

    @property
    def level(self) -> int:
        """The level the next items are generated at."""
        return self._level[0]

    def set_level(self, level: int) -> None:
        """Generate the next items at ``level`` (for this source and all its shards)."""
        self._level[0] = check_int("level", level, 0, self.num_levels - 1)

    def rewind(self) -> None:
        """Restart from the first item of the current seed."""
        self._position = 0
        self._last: tuple[int, dict[str, Any]] | None = None

    def for_shard(self, shard: Shard) -> ProceduralSource:
        """A source serving ``shard``, sharing the generator, the seed and the level."""
        other = object.__new__(ProceduralSource)
        other.generate, other.num_levels, other._level = self.generate, self.num_levels, self._level
        other.shard = shard
        other.reseed(self.seed)
        return other

    def __copy__(self) -> ProceduralSource:
        # A forked env's stream: its own level from here on (its shards share one).
        other = object.__new__(ProceduralSource)
        other.__dict__.update(self.__dict__, _level=list(self._level))
        return other

    def next_item(self) -> dict[str, Any]:
        """The next item of this source's shard, generated at the current level."""
        index = self.shard.item_index(self._position)
        # A repeat of the last item is served as generated, so a level change between
        # two repeats does not split a GRPO group.
        if self._last is None or self._last[0] != index:
            self._last = (index, self.generate(self.seed, index, self.level))
        self._position += 1
        return self._last[1]
