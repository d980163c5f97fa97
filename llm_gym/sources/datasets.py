"""Stored data as a source: Hub datasets, local files and folders, lists of dicts."""

from __future__ import annotations

import functools
import os
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias
from urllib.parse import urlparse

import numpy as np

from llm_gym.checks import check_choice
from llm_gym.sources.base import Shard, Source, _SeededSource

if TYPE_CHECKING:
    from datasets import Dataset, DatasetDict, IterableDataset

__all__ = [
    "DatasetLike",
    "SPLITS",
    "IndexedSource",
    "hub_unavailable_reason",
    "is_iterable_dataset",
    "load_hub_dataset",
    "load_local_dataset",
    "load_records",
    "load_split",
    "task_data",
]

# What a ``dataset=`` argument may be: a Source, a ``datasets`` object, a Hub name or a local
# path, or rows. A string, so that ``datasets`` is imported only by a type checker.
DatasetLike: TypeAlias = (
    "Source | IterableDataset | Dataset | DatasetDict | str | os.PathLike[str]"
    " | Sequence[Mapping[str, object]]"
)

SPLITS = ("train", "test")

_LOCAL_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
# Reading one row of an Arrow-backed Dataset costs ~20 us, a block of 32 ~3 us a row.
_PREFETCH = 32
_HUB_PROBE_TIMEOUT_S = 3.0


def _is_datasets(value: object, class_name: str) -> bool:
    # `datasets` is imported only to load data: a value can only be one of its classes if
    # something already imported it.
    module = sys.modules.get("datasets")
    return module is not None and isinstance(value, getattr(module, class_name))


def is_iterable_dataset(value: object) -> bool:
    """Whether ``value`` is a streaming ``datasets.IterableDataset``."""
    return _is_datasets(value, "IterableDataset")


class IndexedSource(_SeededSource):
    """Serves an indexable dataset in a seeded order, epoch after epoch.

    The order is a pure function of ``(seed, position)``: epoch ``e`` is
    ``default_rng([seed, e]).permutation(n)``, so the same seed gives the same order in every
    process, each epoch serves every item exactly once, and the next epoch reshuffles. Its
    ``k``-th item is record ``shard.item_index(k)`` of the order (see ``Shard``). Forks share
    the data (loaded once) and the seed, and keep their own position.

    >>> source = IndexedSource([{"query": str(i)} for i in range(4)], seed=0)
    >>> first = [source.next_item()["query"] for _ in range(4)]
    >>> source.reseed(0)
    >>> sorted(first), [source.next_item()["query"] for _ in range(4)] == first
    (['0', '1', '2', '3'], True)
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
            raise ValueError("dataset must hold at least one item, got an empty dataset")
        self.data = data
        self.shuffle = bool(shuffle)
        self.shard = shard or Shard()
        self.reseed(seed)

    def __len__(self) -> int:
        return len(self.data)

    def rewind(self) -> None:
        """Restart from the first item of the current seed's order."""
        self._position = 0
        self._epoch, self._order = -1, None
        self._buffer: list[Any] = []  # prefetched rows for positions _position...

    def for_shard(self, shard: Shard) -> IndexedSource:
        """A source over the same data and seed that serves ``shard`` of the stream."""
        return IndexedSource(self.data, shuffle=self.shuffle, seed=self.seed, shard=shard)

    def __copy__(self) -> IndexedSource:
        # A forked env's stream: the same data and position, its own prefetched rows.
        other = object.__new__(IndexedSource)
        other.__dict__.update(self.__dict__, _buffer=list(self._buffer))
        return other

    def order(self, epoch: int) -> np.ndarray:
        """The item indices of ``epoch`` in serving order."""
        n = len(self.data)
        if not self.shuffle:
            return np.arange(n)
        return np.random.default_rng([self.seed, epoch]).permutation(n)

    def next_item(self) -> Mapping[str, Any]:
        """The next item of this source's shard of the order."""
        if not self._buffer:
            ahead = range(self._position, self._position + _PREFETCH)
            indices = [self._index_at(self.shard.item_index(k)) for k in ahead]
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


def load_hub_dataset(
    name: str, config: str | None = None, split: str | None = None
) -> Dataset | DatasetDict:
    """``datasets.load_dataset(name, config, split=split)``, failing fast without a network."""
    reason = hub_unavailable_reason()
    if reason is not None:
        raise ConnectionError(
            f"cannot load {name!r} from the Hugging Face Hub: {reason}. "
            "Set HF_HUB_OFFLINE=1 to use a cached copy."
        )
    import datasets

    return datasets.load_dataset(name, config, split=split)


def load_local_dataset(
    path: str | os.PathLike[str], split: str | None = None
) -> Dataset | DatasetDict:
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
                f"dataset file {str(path)!r} holds no items (it is empty or only blank lines)"
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
    dataset: Dataset | DatasetDict | str | os.PathLike[str] | Sequence[Mapping[str, object]],
    *,
    name: str | None = None,
    split: str | None = None,
) -> Sequence[Any]:
    """Resolve any accepted ``dataset=`` value into an indexable sequence of items.

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
        # A path that looks local is read as one (and named if missing), not asked of the Hub.
        if (
            Path(dataset).expanduser().exists()
            or isinstance(dataset, os.PathLike)
            or str(dataset).startswith((".", "/", "~"))
            or Path(dataset).suffix.lower() in _LOCAL_BUILDERS
        ):
            loaded = load_local_dataset(dataset, split)
        else:
            loaded = load_hub_dataset(dataset, name, split)
        if _is_datasets(loaded, "DatasetDict"):
            return _pick_split(loaded, split, repr(str(dataset)))
        return loaded
    if isinstance(dataset, Sequence) and not isinstance(dataset, bytes):
        for i, item in enumerate(dataset):
            if not isinstance(item, Mapping):
                raise TypeError(
                    f"dataset as a sequence must hold dicts, got {type(item).__name__} at index {i}"
                )
        return list(dataset)
    raise TypeError(
        "dataset must be a Hub dataset name, a local path, a datasets.Dataset or a sequence "
        f"of dicts, got {type(dataset).__name__}"
    )


def load_split(
    name: str,
    split: str,
    data_dir: str | os.PathLike[str] | None,
    env_var: str,
    hub_id: str,
    hub_config: str | None,
) -> Dataset:
    """``split`` of task ``name`` as a ``datasets.Dataset``.

    From ``data_dir`` (a folder holding ``train.jsonl``/``test.jsonl``) if given, else from
    the folder in ``$env_var`` if set, else from the Hub's ``hub_id``; every failure names
    both the local and the Hub option.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if data_dir is not None:
        origin = f"data_dir={str(data_dir)!r}"
    elif os.environ.get(env_var):
        data_dir, origin = os.environ[env_var], f"${env_var}={os.environ[env_var]!r}"
    if data_dir is not None:
        path = Path(data_dir).expanduser() / f"{split}.jsonl"
        if not path.is_file():
            raise FileNotFoundError(
                f"{name}'s {split!r} split was not found: {origin} has no file {path.name} "
                f"({path}). Point data_dir= or ${env_var} at a folder holding "
                f"train.jsonl and test.jsonl, or leave both unset to load {hub_id!r} "
                "from the Hugging Face Hub."
            )
        return load_local_dataset(path)
    try:
        return load_hub_dataset(hub_id, hub_config, split)
    except Exception as error:  # any Hub failure gets the same advice
        raise FileNotFoundError(
            f"{name} could not be loaded from the Hugging Face Hub ({hub_id!r}, config "
            f"{hub_config!r}): {str(error).rstrip('.')}. Offline, pass data_dir= (or set "
            f"${env_var}) to a folder holding train.jsonl and test.jsonl."
        ) from error


def task_data(
    dataset: DatasetLike | None,
    split: str,
    data_dir: str | os.PathLike[str] | None,
    load: Callable[[str, str | os.PathLike[str] | None], Dataset],
) -> Source | IterableDataset | Callable[[], Dataset | Sequence[Any]]:
    """A dataset task's ``Task.source``, its arguments checked: the user's ``dataset`` (a
    source or a streaming dataset as given; other data read with ``split`` when the env is
    made), else ``load(split, data_dir)`` when the env is made."""
    check_choice("split", split, SPLITS)
    if dataset is not None and data_dir is not None:
        raise ValueError("pass either dataset= or data_dir=, not both")
    if dataset is None:
        return functools.partial(load, split, data_dir)
    if isinstance(dataset, Source) or is_iterable_dataset(dataset):
        return dataset
    return functools.partial(load_records, dataset, split=split)
