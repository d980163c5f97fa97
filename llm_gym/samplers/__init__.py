"""Generation backends behind one ``Sampler`` protocol (token ids in, token ids and log-probs
out) and the ``Scorer`` protocol: ``base`` (the protocols and token-id checks), ``openai`` (any
OpenAI-compatible server that returns token ids) and ``vllm`` (a vLLM server llm_gym starts).
The transformers backend is ``llm_gym.policies.TransformersPolicy``; ``SamplerPolicy`` there
turns any sampler into a policy over env observations."""

from llm_gym.samplers.base import (
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
from llm_gym.samplers.openai import OpenAISampler, SamplerError
from llm_gym.samplers.vllm import VLLMSampler, VLLMServer, find_vllm_python

__all__ = [
    "FINISH_REASONS",
    "LogProbOutput",
    "OpenAISampler",
    "Sample",
    "Sampler",
    "SamplerError",
    "Scorer",
    "VLLMSampler",
    "VLLMServer",
    "check_scorer",
    "check_token_batch",
    "check_token_ids",
    "find_vllm_python",
    "is_scorer",
    "response_log_probs",
]
