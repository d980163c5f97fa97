"""``IterableSource``: the items an iterable (a ``DataLoader``) yields."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from llm_gym.checks import check_int
from llm_gym.sources.base import Shard

__all__ = ["IterableSource"]


class IterableSource:
    """Serves the items an iterable yields, in its own order, restarting it when exhausted.

    A yielded item may be one item (a dict), a list of dicts, or a collated batch (a dict of
    equal-length lists or arrays, what a ``DataLoader`` returns); batches are split into
    items. Shuffling and seeding belong to the iterable (e.g. ``DataLoader(generator=...)``).
    Each item is served ``repeats`` times in a row. Its shards share the stream: a vector
    env's sub-envs split it by drawing from it, whatever their shard; so does a copy (a forked
    env's), since an iterator cannot be copied: the fork's next episodes draw from the same
    stream as the original's.
    """

    def __init__(self, iterable: Iterable[Any], *, repeats: int = 1) -> None:
        if isinstance(iterable, (str, bytes, Mapping)) or not isinstance(iterable, Iterable):
            raise TypeError(
                f"dataloader must be an iterable of items or batches (a DataLoader, a list "
                f"of dicts), got {type(iterable).__name__}"
            )
        self.iterable, self.repeats = iterable, repeats
        self._stream = _Stream(iterable)

    def reseed(self, seed: int | None) -> None:
        """No-op: the iterable owns its order."""
        check_int("seed", seed, 0, optional=True)

    def rewind(self) -> None:
        """Restart the iterable from its beginning (``iter()`` again)."""
        self._stream.restart()

    def for_shard(self, shard: Shard) -> IterableSource:
        """A source sharing this one's stream (a shared stream needs no shard)."""
        other = object.__new__(IterableSource)
        other.iterable, other._stream, other.repeats = self.iterable, self._stream, shard.repeats
        return other

    def next_item(self) -> Mapping[str, Any]:
        """The next item the iterable yields (each ``repeats`` times in a row)."""
        return self._stream.next_item(self.repeats)


class _Stream:
    """One pass after another over an iterable, each item handed out ``repeats`` times."""

    def __init__(self, iterable: Iterable[Any]) -> None:
        self.iterable = iterable
        self.restart()

    def restart(self) -> None:
        self._iterator: Iterator[Any] | None = None
        self._pending: list[Any] = []
        self._current: Any = None
        self._served = 0

    def next_item(self, repeats: int) -> Any:
        if self._current is None or self._served >= repeats:
            while not self._pending:
                self._pending = _unbatch(self._next_item())
                self._pending.reverse()  # pop() from the end serves them in order
            self._current, self._served = self._pending.pop(), 0
        self._served += 1
        return self._current

    def _next_item(self) -> Any:
        if self._iterator is None:
            self._iterator = iter(self.iterable)
        try:
            return next(self._iterator)
        except StopIteration:
            pass
        # End of an epoch: start the next one. A one-shot iterator (a generator) has nothing
        # more to give, which would otherwise loop forever.
        self._iterator = iter(self.iterable)
        try:
            return next(self._iterator)
        except StopIteration:
            raise ValueError(
                f"dataloader {type(self.iterable).__name__} yielded no items when restarted; "
                "pass a re-iterable (a list, a DataLoader), not a one-shot iterator"
            ) from None


def _unbatch(item: Any) -> list[Any]:
    if isinstance(item, Mapping):
        values = list(item.values())
        if values and all(_is_column(v) for v in values):
            lengths = {len(v) for v in values}
            if len(lengths) != 1:
                raise ValueError(
                    f"a collated batch must have columns of one length, got lengths "
                    f"{ {k: len(v) for k, v in item.items()} }"
                )
            columns = {k: v.tolist() if hasattr(v, "tolist") else list(v) for k, v in item.items()}
            return [
                dict(zip(columns, row, strict=True)) for row in zip(*columns.values(), strict=True)
            ]
        return [item]
    if isinstance(item, (list, tuple)):
        return list(item)
    raise TypeError(
        f"dataloader items must be dicts, lists of dicts or collated batches, "
        f"got {type(item).__name__}"
    )


def _is_column(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return True
    shape = getattr(value, "shape", None)  # numpy arrays and torch tensors with a batch dim
    return shape is not None and len(shape) >= 1
