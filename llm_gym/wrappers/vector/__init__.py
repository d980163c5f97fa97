"""Vector versions of llm_gym's wrappers, with the single-env ones' names and arguments."""

from llm_gym.wrappers.vector.curriculum import DifficultyCurriculum
from llm_gym.wrappers.vector.kl import KLComputation, KLRewardWrapper, RetrieveKL, RetrieveLogProb

__all__ = [
    "DifficultyCurriculum",
    "KLComputation",
    "KLRewardWrapper",
    "RetrieveKL",
    "RetrieveLogProb",
]
