"""``GRPOConfig``: ``llm-gym train``'s options, each declared once with its help, bounds and
whether a resume may change it (``llm_gym.options``), and the checks across them. Saving,
loading and resuming a run's config live in the run folder's home
(``llm_gym.train.run_folder``). This module imports nothing heavy.

>>> GRPOConfig(group_size=1)
Traceback (most recent call last):
...
ValueError: group_size must be an int >= 2, got 1
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from llm_gym.checks import check_number
from llm_gym.options import number, option, redeclare, resumable
from llm_gym.run.budget import MAX_ENVS
from llm_gym.run.config import DTYPE_NAMES, RunConfig

__all__ = [
    "CHECKPOINT_TOKENS",
    "ADVANTAGE_ESTIMATORS",
    "IMPORTANCE_SAMPLING_LEVELS",
    "LOSS_TYPES",
    "LR_SCHEDULES",
    "PRECISIONS",
    "SCALE_REWARDS",
    "RESUMABLE",
    "TURN_ESTIMATORS",
    "GRPOConfig",
    "module_names",
    "overlong",
]

# The choices of GRPO's loss (llm_gym.train.loss tells each), here where the options are
# checked without torch. TRL's names: "grpo" averages each response's tokens, then the
# responses; "bnpo" the batch's tokens; "dr_grpo" divides the batch's token sum by rows × a
# fixed length (Liu et al., 2025); "dapo" and "cispo" by the token count of the iteration's
# whole batch (Yu et al., 2025; MiniMax, 2025), cispo weighting each log-prob by its capped,
# detached ratio.
# "sapo" gates the ratio with a sigmoid in place of the clip, averaged as grpo (Gao et al.,
# 2025); "luspo" sums each response's tokens before the mean over responses, GSPO's ratio
# (length-unbiased); "vespo" weighs each log-prob by a Gamma function of the response's
# ratio, as dapo's sum (TRL 1.16's defaults for their shapes).
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")  # "sequence": GSPO (Zheng et al., 2025)
SCALE_REWARDS = ("group", "batch", "none")
# How a response's advantage is taken from its group's rewards (llm_gym.train.advantages.
# advantages tells each): GRPO's group-normalised one, RLOO's leave-one-out, REINFORCE++'s
# baseline (the episode's return, one value for all its tokens); then per turn
# (llm_gym.train.advantages.turn_advantages): GEM's batch-normalised discounted returns
# (ReBN), GRPO's normalisation within the group, turn by turn, and the two that see the state
# a turn was made in: Tree-GRPO's among the turns made in it (--branches), VinePPO's from its
# Monte Carlo value (--vine-rollouts).
ADVANTAGE_ESTIMATORS = ("grpo", "rloo", "reinforce++", "rebn", "turn-grpo", "tree-grpo", "vine")
TURN_ESTIMATORS = ("rebn", "turn-grpo", "tree-grpo", "vine")  # each turn's tokens its value
# The learning rate over the run's optimizer steps, after --warmup-steps of linear warm-up
# from 0: held ("constant"), decayed linearly to 0, or along a half cosine to 0
# (transformers' schedules, TRL's lr_scheduler_type).
LR_SCHEDULES = ("constant", "linear", "cosine")
# How the update computes (llm_gym.train.update.PRECISION_WEIGHTS): "fp32" in float32;
# "bf16-mixed" float32 weights and optimizer, the forward and backward under bfloat16
# autocast (TRL's bf16=True, Lightning's "bf16-mixed"); "bf16" bfloat16 weights, stepped
# through float32 masters; "auto" bf16-mixed on a GPU with bfloat16, fp32 elsewhere.
PRECISIONS = ("auto", "fp32", "bf16-mixed", "bf16")
# Tokens of a micro-batch from which activation checkpointing is on by default on the CPU (or
# half the run's token budget, if less): below, the activations are small and recomputing them
# costs a third more time for little.
CHECKPOINT_TOKENS = 2048


# What a run across processes does not do: each needs every process to step alike (an
# episode's turns, an agent's calls, an asynchronous batch) or to share one state (a
# curriculum's level, an adaptive KL coefficient).
_SHARDED_CONFLICTS = (
    ("asynchronous", "--async"), ("agent", "--agent"), ("ray_address", "--ray"),
    ("curriculum", "--curriculum"), ("kl_target", "--kl-target"),
    ("dynamic_sampling", "--dynamic-sampling"),
)  # fmt: skip


def overlong(text: str) -> int | None:
    """``--overlong-cache``: an int >= 0, or ``auto`` (None: the trainer's rule).

    >>> overlong("16"), overlong("auto")
    (16, None)
    """
    return None if text == "auto" else number(int, 0)(text)


def module_names(text: str) -> list[str] | str:
    """``--lora-target-modules``: ``all-linear`` or comma-separated module names.

    >>> module_names("q_proj, v_proj")
    ['q_proj', 'v_proj']
    """
    if text.strip() == "all-linear":
        return "all-linear"
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names or not all(name.replace("_", "").replace(".", "").isalnum() for name in names):
        raise argparse.ArgumentTypeError(
            f"expected 'all-linear' or comma-separated module names, got {text!r}"
        )
    return names


@dataclass
class GRPOConfig(RunConfig):
    """``llm-gym train``'s options: the run (``RunConfig``) and GRPO's own settings; the KL
    penalty (``kl_coef > 0``) is charged against the starting model."""

    # The run's defaults here are the CPU demo's (docs/training.md, "Learning, measured").
    answer_format: str | None = redeclare(RunConfig, "answer_format", "last_number")
    max_new_tokens: int = redeclare(RunConfig, "max_new_tokens", 48)
    # Training samples: greedy (0) would make every group's responses one.
    temperature: float = redeclare(RunConfig, "temperature", 1.0, strict=True)
    kl_coef: float = redeclare(RunConfig, "kl_coef", 0.0)  # 0: no KL penalty, no reference
    out: str = redeclare(RunConfig, "out", "runs/train")
    iterations: int = option(
        20, low=1, resumable=True,
        help="GRPO iterations: sample the groups, then update",
    )  # fmt: skip
    max_sampled_tokens: int | None = option(
        None, low=1, resumable=True, metavar="TOKENS",
        help="stop after the iteration that brings the run's sampled tokens (every process's, "
        "branches' and VinePPO's continuations' included) to TOKENS: credits compare at a "
        "budget; --iterations stays the most (None: no budget)",
    )  # fmt: skip
    groups: int = option(2, low=1, help="questions per iteration")
    # One response has no group to compare with.
    group_size: int = option(8, low=2, help="responses per question")
    learning_rate: float = option(5e-5, low=0, strict=True, help="AdamW's learning rate")
    advantage: str = option(
        "grpo", choices=ADVANTAGE_ESTIMATORS,
        help="each response's advantage from its group's rewards: GRPO's group-normalised, "
        "RLOO's leave-one-out or REINFORCE++'s baseline (one value for the episode); per "
        "turn of a multi-turn episode: rebn, GEM's discounted returns normalised over the "
        "batch, turn-grpo, normalised within the group turn by turn, tree-grpo, against the "
        "turns made in the same state (Tree-GRPO; --branches), or vine, from the Monte Carlo "
        "value of each turn's state (VinePPO; --vine-rollouts) (default: %(default)s)",
    )  # fmt: skip
    # G_t = r_t + gamma * G_{t+1}: 1 sums them, each turn's return the rest of the episode's;
    # single-turn runs: no effect.
    gamma: float = option(
        1.0, low=0, strict=True,
        help="the discount of later turns' rewards, G_t = r_t + gamma G_{t+1}, at most 1 "
        "(GEM takes 0.9 for games; default: %(default)s, their sum)",
    )  # fmt: skip
    dynamic_sampling: int = option(
        0, low=0, metavar="N",
        help="DAPO's dynamic sampling: up to N more batches a step, whose groups replace "
        "those whose rewards are all equal (default: %(default)s, off)",
    )  # fmt: skip
    # A group's branches and VinePPO's values fork the env where a turn was made
    # (llm_gym.episodes.tree).
    branches: int = option(
        0, low=0, metavar="K",
        help="K more episodes a group, each forked at a turn boundary of one of the group's "
        "episodes and played on by the policy, sharing its earlier turns (Tree-GRPO's "
        "expansion; multi-turn tasks; default: %(default)s, independent episodes only)",
    )  # fmt: skip
    vine_rollouts: int = option(
        2, low=1, metavar="K",
        help="with --advantage vine: continuations played from each state a turn was made in, "
        "their mean return its value; sampled, not trained on (default: %(default)s)",
    )  # fmt: skip
    log_episodes: bool = option(
        False, resumable=True,
        help="write each iteration's episodes to episodes.jsonl in the run folder, as "
        "rollout writes them, with their iteration (TRL's log_completions)",
    )  # fmt: skip
    # None: a sixth of the budget for single-turn runs, none for multi-turn and agent runs
    # (whose policy tokens add up over turns), 0: off (llm_gym.train.advantages.
    # overlong_tokens). A third rescued float32's seed 0 and cost bfloat16's seed 7; a sixth
    # kept both (docs/training.md, "A recipe over eight seeds").
    overlong_cache: int | None = option(
        None, low=0, parse=overlong, shown="auto", metavar="TOKENS",
        help="DAPO's soft overlong penalty: a response's reward falls linearly to -1 over its "
        "last TOKENS of --max-new-tokens; 0: off; auto: a sixth of the budget for "
        "single-turn runs, off for multi-turn and agent runs (default: %(default)s)",
    )  # fmt: skip
    mask_truncated: bool = option(
        False,
        help="leave responses that --max-new-tokens cut out of the loss and its token count, "
        "as TRL's mask_truncated_completions (default: %(default)s, they train)",
    )  # fmt: skip
    # transformers' schedules, TRL's lr_scheduler_type; the cosine was chosen over eight
    # seeds (docs/training.md, "A recipe over eight seeds").
    lr_schedule: str = option(
        "cosine", choices=LR_SCHEDULES,
        help="the learning rate over the optimizer steps: held, or decayed to 0 linearly or "
        "along a half cosine (default: %(default)s)",
    )  # fmt: skip
    warmup_steps: int | None = option(
        None, low=0,
        help="optimizer steps of linear warm-up from 0 first (default: %(default)s, a tenth "
        "of the optimizer steps, rounded down, for linear and cosine; none for constant)",
    )  # fmt: skip
    update_epochs: int = option(1, low=1, help="passes over an iteration's responses")
    # The update's memory, not its math: a resume may change these.
    minibatch_size: int = option(
        8, low=1, resumable=True,
        help="responses per forward in the update (memory, not the math)",
    )  # fmt: skip
    max_tokens_per_microbatch: int = option(
        4096, low=1, resumable=True,
        help="tokens per forward in the update, at most (memory, not the math: a batch is "
        "split into micro-batches, shortest first, their gradients summed)",
    )  # fmt: skip
    gradient_checkpointing: bool | None = option(
        None, resumable=True,
        help="keep only each layer's input in the update and recompute the rest in the "
        "backward (less memory, about a third more time; default: %(default)s, on CUDA where "
        "a micro-batch's activations would not fit in the free memory, on the CPU where they "
        f"would outweigh the model's weights or for micro-batches of {CHECKPOINT_TOKENS} "
        "tokens or half the budget, if less, or more)",
    )  # fmt: skip
    # The update's arithmetic (PRECISIONS); --dtype is what sampling and the reference run in.
    precision: str = option(
        "auto", choices=PRECISIONS,
        help="how the update computes: fp32; bf16-mixed (float32 weights and AdamW, bfloat16 "
        "autocast); bf16 (bfloat16 weights, float32 masters in AdamW); auto: bf16-mixed on a "
        "GPU with bfloat16, fp32 elsewhere (default: %(default)s)",
    )  # fmt: skip
    # llm_gym.lm.packing; the loss and gradients are the padded ones.
    packing: bool = option(
        True, resumable=True,
        help="pack each micro-batch's responses into one row: no padding computed, the same "
        "loss and gradients (default: %(default)s)",
    )  # fmt: skip
    # Off, as TRL's disable_dropout, so that the ratio compares the policy with itself, not
    # two dropout masks.
    keep_dropout: bool = option(
        False,
        help="dropout in the update's loss forwards (the model's own and --lora-dropout); "
        "off by default, as in TRL: sampling, the old policy and the reference run without "
        "it either way",
    )  # fmt: skip
    clip_coef: float = option(0.2, low=0, strict=True, help="the surrogate's ratio clip: 1 +- this")
    # GRPO as TRL 1.16 runs it (llm_gym.train.loss; docs/training.md, "Loss variants").
    loss_type: str = option(
        "dapo", choices=LOSS_TYPES,
        help="how the per-token losses add up, as TRL's loss_type (default: %(default)s)",
    )  # fmt: skip
    clip_coef_high: float | None = option(
        None, low=0, strict=True,
        help="clip-higher: the ratio's upper clip 1 + this (default: %(default)s, "
        "--clip-coef); for cispo, the cap on the ratio (5.0 in MiniMax's recipe)",
    )  # fmt: skip
    delta: float | None = option(
        None, low=1, strict=True,
        help="two-sided clipping: cap the unclipped ratio at this too (default: %(default)s, "
        "off)",
    )  # fmt: skip
    importance_sampling_level: str = option(
        "token", choices=IMPORTANCE_SAMPLING_LEVELS,
        help="the ratio per token, or per response (GSPO; default: %(default)s)",
    )  # fmt: skip
    kl_loss_coef: float = option(
        0.0, low=0,
        help="beta: the k3 KL to the starting model in the loss, as TRL's (the adapter "
        "disabled under LoRA; beside --kl-coef's penalty in the reward; default: "
        "%(default)s)",
    )  # fmt: skip
    scale_rewards: str = option(
        "group", choices=SCALE_REWARDS,
        help="advantages divided by the group's reward std, the batch's, or none "
        "(default: %(default)s)",
    )  # fmt: skip
    tis_cap: float | None = option(
        None, low=0, strict=True,
        help="truncated importance sampling: weigh each token by min(exp(trainer's old "
        "log-prob - the sampler's), this), as TRL's token_truncate (default: %(default)s, "
        "off)",
    )  # fmt: skip
    max_grad_norm: float = option(
        1.0, low=0, strict=True,
        help="the gradient's norm is clipped to this before each step, as TRL's "
        "max_grad_norm (default: %(default)s)",
    )  # fmt: skip
    # TRL's entropy bonus and its adaptive control (llm_gym.train.loss.EntropyBonus).
    entropy_coef: float = option(
        0.0, low=0,
        help="an entropy bonus: the loss less this times the mean per-token entropy, as "
        "TRL's entropy_coef; with --entropy-target, its starting value (default: "
        "%(default)s, off)",
    )  # fmt: skip
    entropy_target: float | None = option(
        None, low=0,
        help="TRL's adaptive entropy control: after each step the coefficient rises by "
        "--entropy-coef-delta while the entropy is at or below this, falls above it, and "
        "applies only at or below it (default: %(default)s, off)",
    )  # fmt: skip
    entropy_coef_delta: float = option(
        0.005, low=0, strict=True,
        help="the adaptive coefficient's step (default: %(default)s)",
    )  # fmt: skip
    entropy_coef_min: float = option(
        0.0, low=0, help="the adaptive coefficient's floor (default: %(default)s)"
    )
    entropy_coef_max: float = option(
        1.0, low=0, help="the adaptive coefficient's ceiling (default: %(default)s)"
    )
    kl_target: float | None = option(
        None, low=0, strict=True,
        help="adaptive KL controller's target (default: %(default)s, a constant coefficient)",
    )  # fmt: skip
    kl_horizon: int = option(
        10000, low=1,
        help="the adaptive KL controller's horizon (Ziegler et al.): each update moves the "
        "coefficient by its clipped error times the update's steps over this (with "
        "--kl-target; default: %(default)s)",
    )  # fmt: skip
    eval_episodes: int = option(
        64, low=0, resumable=True,
        help="greedy episodes on held-out questions before and after (0: none)",
    )  # fmt: skip
    eval_seed: int = option(
        1_000_003, low=0,
        help="the seed of the held-out questions; the training stream's is --seed "
        "(default: %(default)s)",
    )  # fmt: skip
    save_every: int = option(10, low=1, resumable=True, help="iterations between checkpoints")
    keep_checkpoints: int = option(
        2, low=1, resumable=True,
        help="the newest checkpoints kept in --out (older ones are deleted once a new one is "
        "complete)",
    )  # fmt: skip
    # What a checkpoint holds: a resume may change these.
    save_optimizer: bool | None = option(
        None, resumable=True,
        help="the optimizer's state in checkpoints, what an exact --resume needs (twice the "
        "weights with AdamW; default: %(default)s, in all but the run's last, which holds "
        "the weights alone)",
    )  # fmt: skip
    save_dtype: str | None = option(
        None, choices=DTYPE_NAMES, resumable=True,
        help="the dtype of weights saved without the optimizer's state (default: "
        "%(default)s, the trained weights' dtype)",
    )  # fmt: skip
    # LoRA through peft.
    lora_rank: int = option(
        0, low=0,
        help="train LoRA adapters of this rank (peft) instead of every weight; the KL's "
        "reference is the model with its adapter disabled, checkpoints hold the adapter "
        "(default: %(default)s, no LoRA)",
    )  # fmt: skip
    lora_alpha: float | None = option(
        None, low=0, strict=True,
        help="LoRA's alpha (default: %(default)s, 2 x --lora-rank)",
    )  # fmt: skip
    lora_dropout: float = option(
        0.0, low=0,
        help="dropout on LoRA's input, in the loss's forwards with --keep-dropout only "
        "(default: %(default)s)",
    )  # fmt: skip
    lora_target_modules: list[str] | str | None = option(
        None, parse=module_names, metavar="NAMES",
        help="comma-separated module names the adapters wrap, or 'all-linear' (default: "
        "%(default)s, peft's for the model's family: q_proj,v_proj for Llama, Qwen2)",
    )  # fmt: skip
    resume: bool = option(False, resumable=True, help="continue from the checkpoint in --out")
    max_staleness: int = option(
        1, low=0,
        help="--async/--ray: updates a batch may be sampled ahead of the update that trains "
        "on it (default: %(default)s; 0: no overlap)",
    )  # fmt: skip
    # An agent program that plays each item through llm_gym's gateway (llm_gym.agents).
    agent: str | None = option(
        None, metavar="MODULE:FUNCTION",
        help="train an agent program: FUNCTION(base_url, api_key, item) -> answer (in MODULE "
        "or a file.py), which calls the model through llm_gym's OpenAI-compatible gateway; "
        "each call is recorded token for token and the task's reward scores the answer "
        "(docs/agents.md; default: %(default)s, the env's own turns)",
    )  # fmt: skip
    # How the samples are drawn, not what is learned from them: a resume may change these.
    num_agents: int = option(
        16, low=1, resumable=True, help="--agent: runs at once (default: %(default)s)"
    )
    agent_timeout: float = option(
        300.0, low=0, strict=True, resumable=True, metavar="SECONDS",
        help="--agent: seconds a run may take; past it the run scores 0 with its error "
        "(default: %(default)s)",
    )  # fmt: skip

    def __post_init__(self) -> None:
        super().__post_init__()  # each option's own bound or choices, and the run's checks
        if self.precision == "bf16" and self.dtype not in ("auto", "bfloat16"):
            raise ValueError(
                f"precision 'bf16' trains bfloat16 weights, which sample and score in bfloat16: "
                f"dtype must be 'bfloat16' or 'auto', got {self.dtype!r}"
            )
        if self.lora_dropout >= 1:
            raise ValueError(f"lora_dropout must be below 1, got {self.lora_dropout}")
        lora_given = (self.lora_alpha, self.lora_dropout or None, self.lora_target_modules)
        if not self.lora_rank and any(value is not None for value in lora_given):
            raise ValueError(
                "lora_alpha, lora_dropout and lora_target_modules (--lora-*) shape LoRA's "
                "adapters: pass lora_rank (--lora-rank) > 0"
            )
        if self.groups * self.group_size > MAX_ENVS:  # a sub-env per response
            raise ValueError(
                f"groups × group_size = {self.groups} × {self.group_size} = "
                f"{self.groups * self.group_size} (--groups, --group-size) is more than the "
                f"{MAX_ENVS} sub-envs a run steps at once"
            )
        self._check_loss()
        if self.kl_target is not None and self.kl_coef == 0:
            raise ValueError("kl_target needs kl_coef > 0 (the adaptive controller's start)")
        if self.tools and self.kl_coef > 0:
            raise ValueError(
                "tools with kl_coef > 0 is not supported yet: the KL wrappers charge each turn "
                "separately; train tool episodes with kl_coef=0"
            )
        if self.ray_address is not None and self.kl_target is not None:
            raise ValueError(
                "kl_target (--kl-target: an adaptive coefficient every sub-env shares) is not "
                "supported with Ray's env workers (--ray), which each hold their own: charge a "
                "constant --kl-coef there"
            )
        if self.asynchronous and self.kl_coef > 0 and self.lora_rank:
            raise ValueError(
                "kl_coef > 0 with lora_rank under --async is not supported yet: the reference "
                "(the model with its adapter disabled) would be scored while the same model "
                "samples or trains; drop one"
            )
        if self.agent is not None:
            if not isinstance(self.agent, str) or self.agent.count(":") != 1:
                raise ValueError(
                    f"agent must be 'module:function' or 'file.py:function', got {self.agent!r}"
                )
            given = [name for name, on in (
                ("--async", self.asynchronous), ("--ray", self.ray_address is not None),
                ("--tools", bool(self.tools)), ("--kl-coef", self.kl_coef > 0),
                ("--curriculum", bool(self.curriculum)), ("--judge", self.judge is not None),
                ("--dynamic-sampling", self.dynamic_sampling > 0),
            ) if on]  # fmt: skip
            if given:
                raise ValueError(
                    f"agent (--agent) is not supported with {', '.join(given)} yet: the agent "
                    "runs its own turns and tools through the gateway, and its episodes are "
                    "scored by the task's reward alone"
                )
        if self.resume and self.overwrite:
            raise ValueError("resume and overwrite contradict each other: pass one")
        if self.backend == "openai":
            raise ValueError(
                "backend 'openai' cannot train: the server's weights must follow the updates; "
                "use backend 'vllm' (llm_gym starts the server and loads each update into it) "
                "or 'transformers'"
            )

    def check_turns(self, multi_turn: bool) -> None:
        """Refuse what does nothing on a task of one turn an episode (``multi_turn`` False):
        a discount of later turns, branches and VinePPO's values, which fork at turns."""
        if multi_turn:
            return
        if self.gamma < 1:
            raise ValueError(
                f"gamma (--gamma {self.gamma}) discounts later turns' rewards, and {self.env} "
                "plays one turn an episode: leave it at 1"
            )
        if self.branches or self.advantage == "vine":
            raise ValueError(
                f"{self.env} plays one turn an episode: --branches and --advantage vine fork "
                "episodes where a turn was made, which needs a multi-turn task (tools, a game, "
                "max_turns > 1)"
            )

    @property
    def group_episodes(self) -> int:
        """The episodes a group trains on: its ``group_size`` chains and its ``branches``."""
        return self.group_size + self.branches

    @property
    def max_response_tokens(self) -> int:
        """The most tokens a response may hold: ``max_new_tokens`` a turn (dr_grpo's
        constant, and the length the memory check sizes a batch by)."""
        return self.max_new_tokens * (self.max_tool_calls + 1 if self.tools else 1)

    def _check_schedule(self) -> None:
        steps = self.iterations * self.update_epochs  # the run's optimizer steps
        if self.warmup_steps is not None and self.warmup_steps > steps:
            raise ValueError(
                f"warmup_steps (--warmup-steps {self.warmup_steps}) is longer than the run's "
                f"{steps} optimizer steps (--iterations {self.iterations} x --update-epochs "
                f"{self.update_epochs}): the rate would never reach --learning-rate; at most "
                f"{steps}"
            )

    def _check_tree(self) -> None:
        # Branched groups and VinePPO's values: what they need, and what does nothing without.
        if self.advantage == "tree-grpo" and not self.branches:
            raise ValueError(
                "advantage 'tree-grpo' compares the turns made in one state, which only "
                "branches share: pass branches (--branches) >= 1"
            )
        if self.vine_rollouts != 2 and self.advantage != "vine":
            raise ValueError(
                f"vine_rollouts (--vine-rollouts {self.vine_rollouts}) sizes VinePPO's values, "
                f"which only --advantage vine takes (got advantage {self.advantage!r})"
            )
        if self.branches or self.advantage == "vine":
            given = [flag for name, flag in (
                ("asynchronous", "--async"), ("agent", "--agent"), ("ray_address", "--ray"),
                ("dynamic_sampling", "--dynamic-sampling"), ("kl_coef", "--kl-coef > 0"),
            ) if getattr(self, name)]  # fmt: skip
            if given:
                what = "--branches" if self.branches else "--advantage vine"
                raise ValueError(
                    f"{what} forks the run's own vector env where turns were made, which "
                    f"{', '.join(given)} does not go with yet: drop one"
                )

    def _check_loss(self) -> None:
        self._check_tree()
        self._check_schedule()
        if self.gamma > 1:
            raise ValueError(f"gamma (--gamma) must be in (0, 1], got {self.gamma!r}")
        if (self.overlong_cache or 0) > self.max_response_tokens:
            raise ValueError(
                f"overlong_cache (--overlong-cache) must be at most the response budget "
                f"{self.max_response_tokens} (--max-new-tokens), got {self.overlong_cache}"
            )
        if self.dynamic_sampling and self.tools:  # known before the env is made
            raise ValueError(
                "dynamic_sampling (--dynamic-sampling) refills single-turn tasks, and --tools "
                "plays several turns an episode: drop one"
            )
        if self.dynamic_sampling and self.asynchronous:
            raise ValueError(
                "dynamic_sampling (--dynamic-sampling) with --async: batches sampled ahead "
                "cannot be refilled; drop one"
            )
        check_number(
            "entropy_coef_max (--entropy-coef-max)", self.entropy_coef_max, self.entropy_coef_min
        )
        adaptive = ("entropy_coef_delta", "entropy_coef_min", "entropy_coef_max")
        fields = self.__dataclass_fields__
        moved = [
            f"--{n.replace('_', '-')}" for n in adaptive if getattr(self, n) != fields[n].default
        ]
        if moved and self.entropy_target is None:
            raise ValueError(
                f"{', '.join(moved)} shape the adaptive entropy control, which only "
                "--entropy-target turns on: pass it, or leave them out"
            )
        if self.entropy_target is not None and not (
            self.entropy_coef_min <= self.entropy_coef <= self.entropy_coef_max
        ):
            raise ValueError(
                f"entropy_coef (--entropy-coef) starts the adaptive control within "
                f"[{self.entropy_coef_min}, {self.entropy_coef_max}] (--entropy-coef-min, "
                f"--entropy-coef-max), got {self.entropy_coef}"
            )
        if self.loss_type == "cispo" and self.clip_coef_high is None:
            raise ValueError(
                "loss_type 'cispo' caps the ratio at clip_coef_high (--clip-coef-high; 5.0 in "
                "MiniMax's recipe): pass it"
            )
        if self.loss_type == "luspo" and self.importance_sampling_level != "sequence":
            raise ValueError(
                "loss_type 'luspo' is GSPO's sequence ratio with a length-unbiased sum: pass "
                "importance_sampling_level='sequence' (--importance-sampling-level sequence)"
            )
        if self.loss_type == "vespo" and self.importance_sampling_level != "token":
            raise ValueError(
                "loss_type 'vespo' takes each response's ratio itself: leave "
                "importance_sampling_level 'token'"
            )
        if self.delta is not None and self.loss_type == "cispo":
            raise ValueError("delta (--delta) caps the clipped surrogate's ratio; cispo has none")
        if self.tis_cap is not None and self.asynchronous:
            raise ValueError(
                "tis_cap (--tis-cap) with --async: an asynchronous batch's ratio is already "
                "taken to the log-probs it was sampled with; drop one"
            )

    def check_world(self, world: int, launch: str = "") -> None:
        """What a run across ``world`` processes needs, said before any process loads
        anything (``launch``: the flags that asked for them, for the message)."""
        if world == 1:
            return
        if self.groups % world:
            raise ValueError(
                f"--groups {self.groups} does not divide by the {world} processes of the "
                f"run{launch}: each process samples whole groups (pass a multiple of the world "
                "size)"
            )
        given = [flag for name, flag in _SHARDED_CONFLICTS if getattr(self, name)]
        if self.backend != "transformers" and self.lora_rank:
            given.append(f"--lora-rank with --backend {self.backend}")
        if given:
            raise ValueError(
                f"a run across {world} processes does not go with {', '.join(given)} yet: "
                "run it in one process"
            )


# What a resumed run may change, as the options declare it: how long it goes on, how it
# saves and reports, where it runs, the update's memory, how the samples are drawn.
# Everything else (task, model, GRPO's settings, seed) would make it another run.
RESUMABLE = resumable(GRPOConfig)
