"""Episodes, played every way llm_gym plays them, as one type (``Episode``): the synchronous
vector env's player (``Episodes``, ``play_episodes``, and ``VectorEpisodes``, the vector env
with its policy as an ``EpisodeSource``), ``AsyncEpisodes``, which keeps every conversation
busy (its env workers on threads here, or Ray actors across machines: ``episodes.ray``), how
an env episode becomes an ``Episode`` (``EpisodeTrace``), and what episodes came to
(``summarize``). ``llm-gym rollout`` and ``llm-gym train`` both play through this package."""

from llm_gym.episodes.asynchronous import AsyncEpisodes
from llm_gym.episodes.episode import ARRAYS, Episode, EpisodeSource, Segment
from llm_gym.episodes.records import KL_INFO_KEYS, EpisodeTrace, json_value
from llm_gym.episodes.summary import (
    Summary,
    iteration_metrics,
    ran_out,
    rubric_part_names,
    summarize,
)
from llm_gym.episodes.vector import Episodes, VectorEpisodes, multi_turn, play_episodes
from llm_gym.episodes.workers import EnvWorker

__all__ = [
    "ARRAYS",
    "KL_INFO_KEYS",
    "AsyncEpisodes",
    "EnvWorker",
    "Episode",
    "EpisodeSource",
    "EpisodeTrace",
    "Episodes",
    "Segment",
    "Summary",
    "VectorEpisodes",
    "json_value",
    "multi_turn",
    "play_episodes",
    "ran_out",
    "rubric_part_names",
    "iteration_metrics",
    "summarize",
]
