"""Alias of ``llm_gym.episodes.ray`` for ``RayLogProbModel`` (its home since the layout of
issue 38, beside the other Ray code). New code imports from ``llm_gym.episodes.ray``."""

from llm_gym.episodes.ray import RayLogProbModel

__all__ = ["RayLogProbModel"]
