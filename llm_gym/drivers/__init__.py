"""How episodes are driven: the record every driver writes, and ``AsyncRollouts``, which keeps
every conversation busy (sub-envs on threads here, or in Ray actors across machines)."""

from llm_gym.drivers.asynchronous import AsyncRollouts
from llm_gym.drivers.records import ARRAYS, Episodes, EpisodeTrace

__all__ = ["ARRAYS", "AsyncRollouts", "EpisodeTrace", "Episodes"]
