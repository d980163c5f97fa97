"""Gymnasium wrappers: KL rewards, their estimators and controllers, a difficulty curriculum."""

from llm_gym.wrappers.controllers import (
    AdaptiveKLController,
    ConstantKLController,
    KLController,
)
from llm_gym.wrappers.curriculum import DifficultyCurriculum
from llm_gym.wrappers.estimators import ESTIMATORS, kl_estimate
from llm_gym.wrappers.kl import KLComputation, KLRewardWrapper, RetrieveKL, RetrieveLogProb
from llm_gym.wrappers.token_kl import TokenKLWrapper

__all__ = [
    "DifficultyCurriculum",
    "RetrieveLogProb",
    "KLComputation",
    "RetrieveKL",
    "KLRewardWrapper",
    "TokenKLWrapper",
    "KLController",
    "ConstantKLController",
    "AdaptiveKLController",
    "ESTIMATORS",
    "kl_estimate",
]
