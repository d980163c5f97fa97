"""Reward functions for LLM environments and for TRL-style trainers; each works without an
env, and ``gsm8k_reward_func``, ``countdown_reward_func`` and ``math_reward_func`` take TRL's
``reward_funcs`` signature."""

from llm_gym.rewards.answers import (
    ANSWER_FORMATS,
    MODES,
    AnswerReward,
    AnswerScore,
    Ungraded,
    extract_answer,
    extract_tags,
    score_answer,
)
from llm_gym.rewards.countdown import (
    CountdownReward,
    countdown_reward_func,
    evaluate_expression,
    score_countdown,
    uses_numbers,
)
from llm_gym.rewards.gsm8k import (
    GSM8KReward,
    GSM8KScore,
    extract_ground_truth,
    gsm8k_reward_func,
    normalize_number,
    score_gsm8k,
)
from llm_gym.rewards.ifeval import (
    IFEvalReward,
    IFEvalScore,
    english_letters,
    has_visible_character,
    ifeval_reward_func,
)
from llm_gym.rewards.math import (
    MATHReward,
    MathVerdict,
    boxed_answer,
    check_math,
    math_equal,
    math_reward_func,
)

__all__ = [
    "ANSWER_FORMATS",
    "MODES",
    "AnswerReward",
    "AnswerScore",
    "CountdownReward",
    "GSM8KReward",
    "GSM8KScore",
    "IFEvalReward",
    "IFEvalScore",
    "MATHReward",
    "MathVerdict",
    "Ungraded",
    "boxed_answer",
    "check_math",
    "countdown_reward_func",
    "english_letters",
    "evaluate_expression",
    "extract_answer",
    "extract_ground_truth",
    "extract_tags",
    "gsm8k_reward_func",
    "has_visible_character",
    "ifeval_reward_func",
    "math_equal",
    "math_reward_func",
    "normalize_number",
    "score_answer",
    "score_countdown",
    "score_gsm8k",
    "uses_numbers",
]
