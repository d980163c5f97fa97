"""Policies for llm_gym's envs: a transformers LM adapter and a masked categorical distribution.

``left_pad`` and ``token_log_probs`` are the two tensor steps of log-prob mode, public for
losses written by hand: a left-padded batch with its attention mask, and per-token log-probs
of a forward pass's logits (0 at padding and at each sequence's first token).
"""

from llm_gym.policies._inputs import left_pad
from llm_gym.policies._scoring import token_log_probs
from llm_gym.policies.distributions import MaskedCategorical
from llm_gym.policies.transformers import LogProbOutput, TransformersPolicy

__all__ = [
    "LLMActorCriticPolicy",
    "LogProbOutput",
    "MaskedCategorical",
    "TransformersPolicy",
    "left_pad",
    "token_log_probs",
]


def __getattr__(name: str) -> type:
    # Imported on first use: stable-baselines3 is an optional dependency (extra "sb3").
    if name == "LLMActorCriticPolicy":
        from llm_gym.policies.sb3 import LLMActorCriticPolicy

        return LLMActorCriticPolicy
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
