"""Alias of ``llm_gym.episodes`` (the home of every episode driver since the layout of
issue 38). New code imports from ``llm_gym.episodes``."""

from llm_gym.episodes import ARRAYS, AsyncEpisodes, AsyncRollouts, Episodes, EpisodeTrace

__all__ = ["ARRAYS", "AsyncEpisodes", "AsyncRollouts", "EpisodeTrace", "Episodes"]
