"""LLM judges as rubric parts: ``Judge`` scores one response, ``GroupJudge`` a GRPO group's
responses against each other (ART's RULER), through any llm_gym sampler."""

from llm_gym.judges.judge import (
    GROUP_TEMPLATE,
    JUDGE_TEMPLATE,
    GroupJudge,
    Judge,
    JudgeStats,
    parse_group_scores,
    parse_score,
)

__all__ = [
    "GROUP_TEMPLATE",
    "JUDGE_TEMPLATE",
    "GroupJudge",
    "Judge",
    "JudgeStats",
    "parse_group_scores",
    "parse_score",
]
