"""Policies for llm_gym's envs: a transformers LM adapter, any ``Sampler`` (vLLM,
OpenAI-compatible) as a policy, an SB3 actor-critic and a masked categorical; the tensor work
they share with wrappers and episodes lives in ``llm_gym.lm``; ``Policy`` is the protocol
every driver calls."""

from llm_gym.policies.base import Policy
from llm_gym.policies.distributions import MaskedCategorical
from llm_gym.policies.sampling import SamplerPolicy
from llm_gym.policies.transformers import TransformersPolicy
from llm_gym.samplers import LogProbOutput

__all__ = [
    "LLMActorCriticPolicy",
    "LogProbOutput",
    "MaskedCategorical",
    "Policy",
    "SamplerPolicy",
    "TransformersPolicy",
]


def __getattr__(name: str) -> type:
    # Imported on first use: stable-baselines3 is an optional dependency (extra "sb3").
    if name == "LLMActorCriticPolicy":
        from llm_gym.policies.sb3 import LLMActorCriticPolicy

        return LLMActorCriticPolicy
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
