"""Agent programs as a source of episodes: ``Gateway`` (an OpenAI-compatible endpoint that
records every call token for token) and ``AgentEpisodes`` (runs an agent per task item
against it: the ``Episode``s ``llm-gym train`` takes). docs: agents.md."""

from llm_gym.agents.episodes import Agent, AgentEpisodes, load_agent
from llm_gym.agents.gateway import EPISODE_HEADER, Gateway
from llm_gym.agents.recording import Call, Recorder, segments

__all__ = [
    "EPISODE_HEADER",
    "Agent",
    "AgentEpisodes",
    "Call",
    "Gateway",
    "Recorder",
    "load_agent",
    "segments",
]
