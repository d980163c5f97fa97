"""Sources: where a task's items come from, in one seeded stream that envs split exactly once.

- ``base``: the ``Source`` protocol and ``Shard`` (which positions of the stream a source
  serves).
- ``datasets``: stored data (Hub, local files, lists of dicts) and ``IndexedSource``, seeded
  epochs over it.
- ``iterable``: ``IterableSource``, whatever an iterable (a ``DataLoader``) yields.
- ``procedural``: ``ProceduralSource``, items generated from a seed at a difficulty level.
"""

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
