"""Samplers and scorers: the two protocols every generation backend implements.

``protocols`` defines ``Sampler`` (prompt token ids in; new token ids, their log-probs, finish
reasons and the policy version out) and ``Scorer`` (log-probs of given responses), and the
token-id checks backends share. ``llm_gym.policies.TransformersPolicy`` implements both;
other backends are one file each.
"""

from llm_gym.samplers.protocols import (
    FINISH_REASONS,
    LogProbOutput,
    Sample,
    Sampler,
    Scorer,
    check_scorer,
    check_token_batch,
    check_token_ids,
    is_scorer,
    response_log_probs,
)

__all__ = [
    "FINISH_REASONS",
    "LogProbOutput",
    "Sample",
    "Sampler",
    "Scorer",
    "check_scorer",
    "check_token_batch",
    "check_token_ids",
    "is_scorer",
    "response_log_probs",
]
