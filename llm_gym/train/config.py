"""``GRPOConfig``, ``llm-gym train``'s options. This module imports nothing heavy (the CLI
reads its defaults before it imports torch)."""

from __future__ import annotations

from dataclasses import dataclass

from llm_gym.checks import check_int, check_number
from llm_gym.run.config import RunConfig

__all__ = ["GRPOConfig"]


@dataclass
class GRPOConfig(RunConfig):
    """``llm-gym train``'s options: the run (``RunConfig``) and GRPO's own settings; the KL
    penalty (``kl_coef > 0``) is charged against the starting model.

    >>> GRPOConfig(group_size=1)
    Traceback (most recent call last):
    ...
    ValueError: group_size must be an int >= 2, got 1
    """

    # The run's defaults here are the CPU demo's (README, "Learning, measured").
    answer_format: str | None = "last_number"
    max_new_tokens: int = 48
    temperature: float = 1.0
    kl_coef: float = 0.0  # 0: no KL penalty, no reference model
    out: str = "runs/train"
    iterations: int = 20
    groups: int = 2  # questions per iteration
    group_size: int = 8  # responses per question
    learning_rate: float = 5e-5
    update_epochs: int = 1
    minibatch_size: int = 8
    clip_coef: float = 0.2
    max_grad_norm: float = 1.0
    kl_target: float | None = None  # adaptive controller's target KL; None: constant coef
    kl_horizon: int = 10000
    eval_episodes: int = 64
    eval_seed: int = 1_000_003  # held out: the training stream's seed is `seed`
    save_every: int = 10
    resume: bool = False

    def __post_init__(self) -> None:
        positive = ("iterations", "groups", "update_epochs", "minibatch_size", "save_every")
        for name in (*positive, "kl_horizon"):
            check_int(name, getattr(self, name), 1)
        check_int("group_size", self.group_size, 2)  # one response has no group to compare
        check_int("eval_episodes", self.eval_episodes, 0)
        for name in ("learning_rate", "clip_coef", "max_grad_norm", "temperature"):
            check_number(name, getattr(self, name), 0, strict=True)
        super().__post_init__()
        check_number("kl_target", self.kl_target, 0, strict=True, optional=True)
        if self.kl_target is not None and self.kl_coef == 0:
            raise ValueError("kl_target needs kl_coef > 0 (the adaptive controller's start)")
        if self.tools and self.kl_coef > 0:
            raise ValueError(
                "tools with kl_coef > 0 is not supported yet: the KL wrappers charge each turn "
                "separately; train tool episodes with kl_coef=0"
            )
        if self.resume and self.overwrite:
            raise ValueError("resume and overwrite contradict each other: pass one")
