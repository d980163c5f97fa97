"""The generation backends, one file each, behind one ``Sampler`` protocol (token ids in, token
ids and log-probs out) and the ``Scorer`` protocol: ``base`` (the protocols, per-request
``SamplingSettings``, ``check_sampler`` and token-id checks), ``transformers``
(``TransformersSampler``: ``model.generate`` with log-probs; ``llm_gym.policies.
TransformersPolicy`` is the policy over it), ``openai`` (any OpenAI-compatible server that
returns token ids), ``vllm`` (a vLLM server llm_gym starts), ``batching`` (``BatchingSampler``:
many callers, one sample call) and ``weights`` (a trained model's weights to a server).
``llm_gym.policies.SamplerPolicy`` turns any sampler into a policy over env observations."""

from llm_gym.samplers.base import (
    FINISH_REASONS,
    ConfigurableSampler,
    LogProbOutput,
    Sample,
    Sampler,
    SamplingSettings,
    Scorer,
    check_sampler,
    check_scorer,
    check_token_batch,
    check_token_ids,
    is_scorer,
    response_log_probs,
)
from llm_gym.samplers.batching import Batched, BatchingSampler
from llm_gym.samplers.openai import OpenAISampler, SamplerError
from llm_gym.samplers.transformers import TransformersSampler
from llm_gym.samplers.vllm import VLLMSampler, VLLMServer, find_vllm_python

__all__ = [
    "FINISH_REASONS",
    "Batched",
    "BatchingSampler",
    "ConfigurableSampler",
    "LogProbOutput",
    "OpenAISampler",
    "Sample",
    "Sampler",
    "SamplerError",
    "SamplingSettings",
    "Scorer",
    "TransformersSampler",
    "VLLMSampler",
    "VLLMServer",
    "check_sampler",
    "check_scorer",
    "check_token_batch",
    "check_token_ids",
    "find_vllm_python",
    "is_scorer",
    "response_log_probs",
]
