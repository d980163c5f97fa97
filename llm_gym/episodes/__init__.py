"""Episodes, played every way llm_gym plays them: the synchronous vector env's player
(``Episodes``, ``play_episodes``), ``AsyncEpisodes``, which keeps every conversation busy (its
env workers on threads here, or Ray actors across machines: ``episodes.ray``), and the record
every one of them writes (``EpisodeTrace``). ``llm-gym rollout`` and ``llm-gym train`` both
play through this package."""

from llm_gym.episodes.asynchronous import AsyncEpisodes, AsyncRollouts
from llm_gym.episodes.records import ARRAYS, KL_INFO_KEYS, EpisodeTrace, json_value
from llm_gym.episodes.vector import Episodes, multi_turn, play_episodes
from llm_gym.episodes.workers import EnvWorker

__all__ = [
    "ARRAYS",
    "KL_INFO_KEYS",
    "AsyncEpisodes",
    "AsyncRollouts",
    "EnvWorker",
    "EpisodeTrace",
    "Episodes",
    "json_value",
    "multi_turn",
    "play_episodes",
]
