"""Policies for llm_gym's envs: a transformers LM adapter and a masked categorical distribution."""

from llm_gym.policies.distributions import MaskedCategorical
from llm_gym.policies.transformers import LogProbOutput, TransformersPolicy

__all__ = ["LogProbOutput", "MaskedCategorical", "TransformersPolicy"]
