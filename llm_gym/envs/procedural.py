"""``ProceduralSource``: samples generated on demand, seeded, at a difficulty level.

Where ``IndexedSource`` serves a stored dataset, this one asks a generator for sample
``index`` of ``seed`` at the current level: ``generate(seed, index, level) -> dict``. The same
seed gives the same samples in every process, and there are no epochs (every sample is new).
Forks (the sub-envs of one vector env) share the seed and the level and serve their own
``Shard`` of the indices, so a curriculum that raises the level raises it for all of them.

>>> source = ProceduralSource(lambda seed, i, level: {"query": f"{seed}:{i}:{level}"},
...                           num_levels=3, level=1, seed=7)
>>> [source.next_record()["query"] for _ in range(2)]
['7:0:1', '7:1:1']
>>> fork = source.fork(Shard(index=1, count=2))
>>> source.set_level(2)
>>> [fork.next_record()["query"] for _ in range(2)]
['7:1:2', '7:3:2']
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from llm_gym.envs.sharding import Shard

__all__ = ["ProceduralSource"]

Generate = Callable[[int, int, int], dict[str, Any]]


class ProceduralSource:
    """Serves ``generate(seed, index, level)`` for ``index = 0, 1, 2, ...``.

    Args:
        generate: builds one sample (a dict with at least a ``"query"``).
        num_levels: how many difficulty levels there are (``0 .. num_levels - 1``).
        level: the level to start at.
        seed: the samples' seed (None: a fresh random one, until ``reseed``).
        shard: which indices this source serves, each how often (default: all, once).
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
        if isinstance(num_levels, bool) or not isinstance(num_levels, int) or num_levels < 1:
            raise ValueError(f"num_levels must be an int >= 1, got {num_levels!r}")
        self.generate, self.num_levels = generate, num_levels
        self._level = [_check_level(level, num_levels)]  # one cell, shared with the forks
        self.shard = shard or Shard()
        self.reseed(seed)

    @property
    def level(self) -> int:
        return self._level[0]

    def set_level(self, level: int) -> None:
        """Generate the next samples at ``level`` (for this source and all its forks)."""
        self._level[0] = _check_level(level, self.num_levels)

    @property
    def position(self) -> int:
        """How many samples were served since the last reseed or rewind."""
        return self._position

    def reseed(self, seed: int | None) -> None:
        """Restart from the first sample of ``seed`` (a fresh random seed if None)."""
        if seed is not None and (
            isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0
        ):
            raise ValueError(f"seed must be None or an int >= 0, got {seed!r}")
        self.seed = int(np.random.SeedSequence().entropy % 2**63) if seed is None else int(seed)
        self.rewind()

    def rewind(self) -> None:
        """Restart from the first sample of the current seed."""
        self._position = 0
        self._last: tuple[int, dict[str, Any]] | None = None

    def fork(self, shard: Shard) -> ProceduralSource:
        """A source serving ``shard``, sharing the generator, the seed and the level."""
        other = object.__new__(ProceduralSource)
        other.generate, other.num_levels, other._level = self.generate, self.num_levels, self._level
        other.shard = shard
        other.reseed(self.seed)
        return other

    def next_record(self) -> dict[str, Any]:
        index = self.shard.record(self._position)
        # A repeat of the last sample is served as generated, so a level change between
        # two repeats does not split a GRPO group.
        if self._last is None or self._last[0] != index:
            self._last = (index, self.generate(self.seed, index, self.level))
        self._position += 1
        return self._last[1]


def _check_level(level: Any, num_levels: int) -> int:
    if isinstance(level, bool) or not isinstance(level, (int, np.integer)):
        raise TypeError(f"level must be an int, got {type(level).__name__}")
    if not 0 <= level < num_levels:
        raise ValueError(f"level must be in [0, {num_levels - 1}], got {level}")
    return int(level)
