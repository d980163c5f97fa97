"""Rubrics: a reward made of named parts, and the LLM judges that can be its parts.

``score`` (``TaskScore``, ``TaskReward``: what any reward says of a response), ``rubric``
(``Rubric`` and its ``Part``s, ``answer_rubric``, ``extend_reward``), ``judges`` (``Judge``
scores one response, ``GroupJudge`` a GRPO group's responses against each other, ART's RULER,
through any llm_gym sampler) and ``run`` (``RunRubric``: the judge parts of ``--rubric``).
The judges' names import on first use: a task's reward needs no sampler (nor torch)."""

from llm_gym._lazy import lazy_exports
from llm_gym.rubrics.rubric import (
    ROLES,
    TASK_PART,
    GroupPartFn,
    Part,
    PartFn,
    Rubric,
    answer_rubric,
    extend_reward,
    in_thread,
)
from llm_gym.rubrics.score import TaskReward, TaskScore

# Public name -> the module that defines it, imported on first use.
_JUDGES = {
    **dict.fromkeys(
        (
            "GROUP_TEMPLATE", "JUDGE_TEMPLATE", "GroupJudge", "Judge", "JudgeStats",
            "neutralise", "parse_group_scores", "parse_score",
        ),
        "llm_gym.rubrics.judges",
    ),
    **dict.fromkeys(("JUDGE_NEW_TOKENS", "RunRubric", "judge_rubric"), "llm_gym.rubrics.run"),
}  # fmt: skip

__all__ = [
    "ROLES",
    "TASK_PART",
    "GroupPartFn",
    "Part",
    "PartFn",
    "Rubric",
    "TaskReward",
    "TaskScore",
    "answer_rubric",
    "extend_reward",
    "in_thread",
    *_JUDGES,
]

__getattr__ = lazy_exports(__name__, _JUDGES)
