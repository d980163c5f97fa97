"""Alias of ``llm_gym.lm.loading`` (its home since the layout of issue 38): models and
tokenizers that load offline. New code imports from ``llm_gym.lm``."""

from llm_gym.lm import loading
from llm_gym.lm.loading import *  # noqa: F403  (every public name of the new home)

__all__ = loading.__all__
