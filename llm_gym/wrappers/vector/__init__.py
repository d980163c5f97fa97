"""Vector versions of llm_gym's wrappers, with the same names and arguments as the
single-env ones: the KL wrappers (one padded forward for N envs) and the curriculum."""

from llm_gym.wrappers.vector.curriculum import DifficultyCurriculum
from llm_gym.wrappers.vector.kl import KLComputation, KLRewardWrapper, RetrieveKL, RetrieveLogProb

__all__ = [
    "DifficultyCurriculum",
    "KLComputation",
    "KLRewardWrapper",
    "RetrieveKL",
    "RetrieveLogProb",
]
