"""Sources: where a task's items come from, in one seeded stream that envs split exactly once
(``Source``, ``Shard``)."""

from llm_gym.sources.base import Shard, Source
from llm_gym.sources.datasets import IndexedSource, load_records, load_split
from llm_gym.sources.iterable import IterableSource
from llm_gym.sources.procedural import ProceduralSource

__all__ = [
    "IndexedSource",
    "IterableSource",
    "ProceduralSource",
    "Shard",
    "Source",
    "load_records",
    "load_split",
]
