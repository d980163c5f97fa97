"""Agent programs as a source of episodes: ``Gateway`` (an OpenAI-compatible endpoint that
records every call token for token) and ``AgentRollouts`` (runs an agent per task item
against it and yields the episode records ``llm-gym train`` takes). docs: agents.md."""

from llm_gym.agents.gateway import EPISODE_HEADER, Gateway
from llm_gym.agents.recording import Call, Recorder, Segment, segments
from llm_gym.agents.rollouts import Agent, AgentRollouts, load_agent

__all__ = [
    "EPISODE_HEADER",
    "Agent",
    "AgentRollouts",
    "Call",
    "Gateway",
    "Recorder",
    "Segment",
    "load_agent",
    "segments",
]
