"""Where a ``DatasetChatEnv`` gets its samples: Hub datasets, local files, lists, dataloaders.

``load_records`` turns any accepted ``dataset=`` value into something indexable (a
``datasets.Dataset`` or a list of dicts). ``IndexedSource`` serves it in a seeded order, one
epoch at a time; ``IterableSource`` serves whatever an iterable (a ``DataLoader``, a list of
batches) yields, restarting it when it runs out.

The order of an ``IndexedSource`` is a pure function of ``(seed, position)``: epoch ``e`` is
``default_rng([seed, e]).permutation(n)``. The same seed gives the same order in every
process, each epoch serves every sample exactly once, and the next epoch reshuffles.

>>> source = IndexedSource([{"query": str(i)} for i in range(4)], seed=0)
>>> first = [source.next_record()["query"] for _ in range(4)]
>>> sorted(first)
['0', '1', '2', '3']
>>> source.reseed(0)
>>> [source.next_record()["query"] for _ in range(4)] == first
True
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import numpy as np

from llm_gym.envs.sharding import Shard

__all__ = [
    "IndexedSource",
    "IterableSource",
    "hub_unavailable_reason",
    "is_iterable_dataset",
    "load_hub_dataset",
    "load_local_dataset",
    "load_records",
]

_LOCAL_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
# Reading one row of an Arrow-backed Dataset costs ~20 us, a block of 32 ~3 us a row.
_PREFETCH = 32
_HUB_PROBE_TIMEOUT_S = 3.0


def _is_datasets(value: Any, class_name: str) -> bool:
    # `datasets` is imported only to load data: a value can only be one of its classes if
    # something already imported it.
    module = sys.modules.get("datasets")
    return module is not None and isinstance(value, getattr(module, class_name))


def is_iterable_dataset(value: Any) -> bool:
    """Whether ``value`` is a streaming ``datasets.IterableDataset``."""
    return _is_datasets(value, "IterableDataset")


def _fresh_seed() -> int:
    return int(np.random.SeedSequence().entropy)


def _check_seed(name: str, seed: Any) -> int | None:
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"{name} must be None or an int >= 0, got {seed!r}")
    return int(seed)


class IndexedSource:
    """Serves an indexable dataset in a seeded order, epoch after epoch.

    Its ``k``-th sample is record ``shard.record(k)`` of the order (see ``Shard``). Forks
    share the data (loaded once) and the seed, and keep their own position.
    """

    def __init__(
        self,
        data: Sequence[Any],
        *,
        shuffle: bool = True,
        seed: int | None = None,
        shard: Shard | None = None,
    ) -> None:
        if len(data) == 0:
            raise ValueError("dataset must hold at least one sample, got an empty dataset")
        self.data = data
        self.shuffle = bool(shuffle)
        self.shard = shard or Shard()
        self.reseed(seed)

    def __len__(self) -> int:
        return len(self.data)

    @property
    def columns(self) -> list[str]:
        if _is_datasets(self.data, "Dataset"):
            return list(self.data.column_names)
        first = self.data[0]
        return list(first) if isinstance(first, Mapping) else []

    @property
    def position(self) -> int:
        """How many samples were served since the last reseed or rewind."""
        return self._position

    def reseed(self, seed: int | None) -> None:
        """Restart from the first sample of the order that ``seed`` defines (new if None)."""
        seed = _check_seed("seed", seed)
        self.seed = _fresh_seed() if seed is None else seed
        self.rewind()

    def rewind(self) -> None:
        """Restart from the first sample of the current seed's order."""
        self._position = 0
        self._epoch, self._order = -1, None
        self._buffer: list[Any] = []  # prefetched rows for positions _position...

    def fork(self, shard: Shard) -> IndexedSource:
        """A source over the same data and seed that serves ``shard`` of the stream."""
        other = object.__new__(IndexedSource)
        other.data, other.shuffle, other.shard = self.data, self.shuffle, shard
        other.reseed(self.seed)
        return other

    def order(self, epoch: int) -> np.ndarray:
        """The sample indices of ``epoch`` in serving order."""
        n = len(self.data)
        if not self.shuffle:
            return np.arange(n)
        return np.random.default_rng([self.seed, epoch]).permutation(n)

    def next_record(self) -> Any:
        if not self._buffer:
            ahead = range(self._position, self._position + _PREFETCH)
            indices = [self._index_at(self.shard.record(k)) for k in ahead]
            if _is_datasets(self.data, "Dataset"):
                self._buffer = self.data.__getitems__(indices)
            else:
                self._buffer = [self.data[i] for i in indices]
            self._buffer.reverse()  # pop() from the end serves them in order
        self._position += 1
        return self._buffer.pop()

    def _index_at(self, record: int) -> int:
        epoch, index = divmod(record, len(self.data))
        if epoch != self._epoch:
            self._epoch, self._order = epoch, self.order(epoch)
        return int(self._order[index])


class IterableSource:
    """Serves the samples an iterable yields, in its own order, restarting it when exhausted.

    A yielded item may be one sample (a dict), a list of dicts, or a collated batch (a dict of
    equal-length lists or arrays, what a ``DataLoader`` returns); batches are split into
    samples. Shuffling and seeding belong to the iterable (e.g. ``DataLoader(generator=...)``).
    Each sample is served ``repeats`` times in a row. Forks share the stream, so a vector
    env's sub-envs draw from one stream, as TorchRL's batched env does: that is how they
    split it, whatever their shard.
    """

    def __init__(self, iterable: Iterable[Any], *, repeats: int = 1) -> None:
        if isinstance(iterable, (str, bytes, Mapping)) or not isinstance(iterable, Iterable):
            raise TypeError(
                f"dataloader must be an iterable of samples or batches (a DataLoader, a list "
                f"of dicts), got {type(iterable).__name__}"
            )
        self.iterable = iterable
        self.repeats = repeats
        self._stream = _Stream(iterable)

    def reseed(self, seed: int | None) -> None:
        """No-op: the iterable owns its order."""
        _check_seed("seed", seed)

    def rewind(self) -> None:
        """Restart the iterable from its beginning (``iter()`` again)."""
        self._stream.restart()

    def fork(self, shard: Shard) -> IterableSource:
        """A source sharing this one's stream (a shared stream needs no shard)."""
        other = object.__new__(IterableSource)
        other.iterable, other._stream = self.iterable, self._stream
        other.repeats = shard.repeats
        return other

    def next_record(self) -> Any:
        return self._stream.next_record(self.repeats)


class _Stream:
    """One pass after another over an iterable, each sample handed out ``repeats`` times."""

    def __init__(self, iterable: Iterable[Any]) -> None:
        self.iterable = iterable
        self.restart()

    def restart(self) -> None:
        self._iterator: Iterator[Any] | None = None
        self._pending: list[Any] = []
        self._current: Any = None
        self._served = 0

    def next_record(self, repeats: int) -> Any:
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
                f"dataloader {type(self.iterable).__name__} yielded no samples when restarted; "
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


def hub_unavailable_reason() -> str | None:
    """Why the Hugging Face Hub cannot be reached now, or None if it answers.

    Checked before ``load_dataset`` because, without a network, the Hub client retries for
    about 25 s before giving up. ``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE`` skip the probe
    (``load_dataset`` then reads only the local cache).
    """
    import datasets

    if datasets.config.HF_HUB_OFFLINE:
        return None  # offline mode: the cache lookup is fast and needs no probe
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host = url.hostname or "huggingface.co"
    port = url.port or (80 if url.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=_HUB_PROBE_TIMEOUT_S).close()
    except OSError as error:
        return f"{host}:{port} is unreachable ({error})"
    return None


def load_hub_dataset(name: str, config: str | None = None, split: str | None = None) -> Any:
    """``datasets.load_dataset(name, config, split=split)``, failing fast without a network."""
    reason = hub_unavailable_reason()
    if reason is not None:
        raise ConnectionError(
            f"cannot load {name!r} from the Hugging Face Hub: {reason}. "
            "Set HF_HUB_OFFLINE=1 to use a cached copy."
        )
    import datasets

    return datasets.load_dataset(name, config, split=split)


def load_local_dataset(path: str | os.PathLike[str], split: str | None = None) -> Any:
    """A local ``.jsonl``/``.json``/``.parquet`` file, or a folder of them, read by ``datasets``.

    A folder's files are matched to splits by name (``train.jsonl``, ``test.parquet``...);
    a single file is the whole dataset, whatever ``split`` says.
    """
    import datasets

    path = Path(path).expanduser()
    if path.is_dir():
        try:
            return datasets.load_dataset(str(path), split=split)
        except ValueError as error:  # datasets' message lists the splits it found
            raise ValueError(
                f"split={split!r} cannot be read from folder {path}: {error}"
            ) from error
    if path.is_file():
        builder = _LOCAL_BUILDERS.get(path.suffix.lower())
        if builder is None:
            raise ValueError(
                f"dataset file must end in {', '.join(_LOCAL_BUILDERS)}, got {path.name!r}"
            )
        if builder == "json" and not _has_content(path):
            raise ValueError(
                f"dataset file {str(path)!r} holds no samples (it is empty or only blank lines)"
            )
        return datasets.load_dataset(builder, data_files=str(path), split="train")
    raise FileNotFoundError(f"dataset path {str(path)!r} does not exist")


def _has_content(path: Path) -> bool:
    # Reads up to the first non-blank character: datasets raises a bare StopIteration for an
    # empty file and "corresponds to no data" for blank lines.
    with path.open("rb") as f:
        while chunk := f.read(1 << 16):
            if chunk.strip():
                return True
    return False


def _pick_split(dataset_dict: Mapping[str, Any], split: str | None, what: str) -> Any:
    if split is None:
        if len(dataset_dict) == 1:
            return next(iter(dataset_dict.values()))
        if "train" in dataset_dict:  # TorchRL's default
            return dataset_dict["train"]
        raise ValueError(
            f"split= is needed to choose among the splits of {what}: {list(dataset_dict)}"
        )
    if split not in dataset_dict:
        raise ValueError(f"split must be one of {list(dataset_dict)} for {what}, got {split!r}")
    return dataset_dict[split]


def load_records(
    dataset: Any, *, name: str | None = None, split: str | None = None
) -> Sequence[Any]:
    """Resolve any accepted ``dataset=`` value into an indexable sequence of samples.

    Accepted: a ``datasets.Dataset`` (or ``DatasetDict``, with ``split``), a path to a local
    file or folder, a Hub dataset name (with ``name`` as its config), or a sequence of dicts.

    >>> len(load_records([{"query": "a"}, {"query": "b"}]))
    2
    """
    if _is_datasets(dataset, "Dataset"):
        return dataset
    if _is_datasets(dataset, "DatasetDict"):
        return _pick_split(dataset, split, "the DatasetDict")
    if isinstance(dataset, (str, os.PathLike)):
        if Path(dataset).expanduser().exists():
            loaded = load_local_dataset(dataset, split)
        elif (
            isinstance(dataset, os.PathLike)
            or str(dataset).startswith((".", "/", "~"))
            or Path(dataset).suffix.lower() in _LOCAL_BUILDERS
        ):
            raise FileNotFoundError(f"dataset path {str(dataset)!r} does not exist")
        else:
            loaded = load_hub_dataset(dataset, name, split)
        if _is_datasets(loaded, "DatasetDict"):
            return _pick_split(loaded, split, repr(str(dataset)))
        return loaded
    if isinstance(dataset, Sequence) and not isinstance(dataset, bytes):
        for i, sample in enumerate(dataset):
            if not isinstance(sample, Mapping):
                raise TypeError(
                    f"dataset as a sequence must hold dicts, got {type(sample).__name__} at "
                    f"index {i}"
                )
        return list(dataset)
    raise TypeError(
        "dataset must be a Hub dataset name, a local path, a datasets.Dataset or a sequence "
        f"of dicts, got {type(dataset).__name__}"
    )
