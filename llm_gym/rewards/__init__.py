"""Reward functions for LLM environments and for TRL-style trainers."""

from llm_gym.rewards.gsm8k import (
    MODES,
    GSM8KReward,
    GSM8KScore,
    extract_answer,
    extract_ground_truth,
    extract_tags,
    gsm8k_reward_func,
    normalize_number,
    score_gsm8k,
)

__all__ = [
    "MODES",
    "GSM8KReward",
    "GSM8KScore",
    "extract_answer",
    "extract_ground_truth",
    "extract_tags",
    "gsm8k_reward_func",
    "normalize_number",
    "score_gsm8k",
]
