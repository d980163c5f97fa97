"""The run's rubric: what ``--rubric`` and ``--judge`` add to a run's task env, the judge parts
and what the task's own parts pay. ``llm_gym.run.setup.run_rubric`` reads them off a run's
config and makes the judge's sampler; the parts are made here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from llm_gym.rubrics.judges import GroupJudge, Judge
from llm_gym.rubrics.rubric import Part
from llm_gym.samplers.base import Sampler

__all__ = ["JUDGE_NEW_TOKENS", "RunRubric", "judge_rubric"]

# The command's judges are score-only: the reply is started for them ("Score:", "Response
# 1:"), greedy, a few tokens a score, so that a small judge keeps to the format and a call
# costs little. A judge with reasons is built in Python (llm_gym.rubrics, docs/rubrics.md).
JUDGE_NEW_TOKENS = 6


@dataclass
class RunRubric:
    """What ``--rubric`` and ``--judge`` add to a run's task env: the judge ``parts`` (in
    the env's ``reward_parts``), what the task's own parts pay (``task_weight``), and the
    ``judges`` asked (for their ``stats``)."""

    parts: list[Part] = field(default_factory=list)
    task_weight: float = 1.0
    judges: dict[str, Judge | GroupJudge] = field(default_factory=dict)

    def env_options(self) -> dict[str, Any]:
        """The env arguments (none for the task's reward alone)."""
        if not self.parts and self.task_weight == 1.0:
            return {}
        return {"reward_parts": self.parts, "task_weight": self.task_weight}

    def stats(self) -> dict[str, dict[str, float]] | None:
        """Each judge's ``JudgeStats`` as a dict, by part (None without a judge)."""
        return {name: j.stats.as_dict() for name, j in self.judges.items()} or None

    def close(self) -> None:
        """Stop each judge's batching thread and its sampler's server, if any."""
        for judge in self.judges.values():
            judge.close()
            close = getattr(judge.sampler, "close", None)
            if close is not None:
                close()


def judge_rubric(
    weights: Mapping[str, float], sampler: Sampler, tokenizer: Any, *, task_weight: float
) -> RunRubric:
    """The run's rubric of judge ``weights`` (``{"judge" | "group-judge": weight}``, as
    ``--rubric`` gives them; weight 0: a metric), every judge asking ``sampler`` with prompts
    in ``tokenizer``'s chat template, score-only (its reply started for it)."""
    rubric = RunRubric(task_weight=task_weight)
    for name, weight in weights.items():
        role = "reward" if weight > 0 else "metric"
        if name == "judge":
            judge: Judge | GroupJudge = Judge(sampler, tokenizer, reply_prefix="Score:")
            rubric.parts.append(Part(name, judge, weight=weight, role=role))
        else:
            judge = GroupJudge(sampler, tokenizer, reply_prefix="Response 1:")
            rubric.parts.append(Part(name, judge, weight=weight, role=role, group=True))
        rubric.judges[name] = judge
    return rubric
