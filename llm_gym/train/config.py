"""``GRPOConfig``, ``llm-gym train``'s options, and the copy of it a run folder keeps so that
``--resume`` continues the very run it interrupted. This module imports nothing heavy.

>>> GRPOConfig(group_size=1)
Traceback (most recent call last):
...
ValueError: group_size must be an int >= 2, got 1
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llm_gym.checks import check_bool, check_choice, check_int, check_number
from llm_gym.run.budget import MAX_ENVS
from llm_gym.run.config import DTYPE_NAMES, RunConfig, rubric_weights
from llm_gym.run.files import write_text

if TYPE_CHECKING:
    from collections.abc import Sequence

    import gymnasium as gym

__all__ = [
    "CHECKPOINT_TOKENS",
    "CONFIG_FILE",
    "ADVANTAGE_ESTIMATORS",
    "IMPORTANCE_SAMPLING_LEVELS",
    "LOSS_TYPES",
    "LR_SCHEDULES",
    "PRECISIONS",
    "SCALE_REWARDS",
    "RESUMABLE",
    "TURN_ESTIMATORS",
    "GRPOConfig",
    "check_episode_groups",
    "check_resumable",
    "check_vector_env",
    "load_config",
    "resume_conflicts",
]

CONFIG_FILE = "run_config.json"  # the run's GRPOConfig, written when the run starts
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
# (ReBN), and GRPO's normalisation within the group, turn by turn.
ADVANTAGE_ESTIMATORS = ("grpo", "rloo", "reinforce++", "rebn", "turn-grpo")
TURN_ESTIMATORS = ("rebn", "turn-grpo")  # each turn's tokens their turn's value
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
# What a resumed run may change: how long it goes on, how it saves and reports, where it
# runs. Everything else (task, model, GRPO's settings, seed) would make it another run.
RESUMABLE = (
    "iterations", "save_every", "keep_checkpoints", "eval_episodes", "progress", "device",
    "out", "resume", "overwrite", "report_to",
    # the update's memory, not its math
    "minibatch_size", "max_tokens_per_microbatch", "gradient_checkpointing", "packing",
    "save_optimizer", "save_dtype",  # what a checkpoint holds
    # how the samples are drawn, not what is learned from them
    "num_agents", "agent_timeout",
    "backend", "base_url", "served_model", "backend_args", "vllm_python",
    "ray_address", "workers",  # where the env workers run
)  # fmt: skip


# What an env object (not an id) cannot be asked for: each makes envs of its own from
# config.env (the asynchronous driver's, an agent's, Ray's workers, the held-out evaluation)
# or wraps the ones it makes (curriculum, rubric).
_ENV_OBJECT_CONFLICTS = (
    ("asynchronous", "--async"), ("agent", "--agent"), ("ray_address", "--ray"),
    ("curriculum", "--curriculum"), ("eval_episodes", "--eval-episodes"),
)  # fmt: skip
# What a run across processes does not do: each needs every process to step alike (an
# episode's turns, an agent's calls, an asynchronous batch) or to share one state (a
# curriculum's level, an adaptive KL coefficient).
_SHARDED_CONFLICTS = (
    ("asynchronous", "--async"), ("agent", "--agent"), ("ray_address", "--ray"),
    ("curriculum", "--curriculum"), ("kl_target", "--kl-target"),
    ("dynamic_sampling", "--dynamic-sampling"),
)  # fmt: skip
# What a trainer's env must observe: the prompt's tokens, the history for the episode's
# record and which tokens the policy wrote.
_TRAINER_KEYS = ("tokens", "history", "policy_mask")


@dataclass
class GRPOConfig(RunConfig):
    """``llm-gym train``'s options: the run (``RunConfig``) and GRPO's own settings; the KL
    penalty (``kl_coef > 0``) is charged against the starting model."""

    # The run's defaults here are the CPU demo's (docs/training.md, "Learning, measured").
    answer_format: str | None = "last_number"
    max_new_tokens: int = 48
    temperature: float = 1.0
    kl_coef: float = 0.0  # 0: no KL penalty, no reference model
    out: str = "runs/train"
    iterations: int = 20
    groups: int = 2  # questions per iteration
    group_size: int = 8  # responses per question
    learning_rate: float = 5e-5
    advantage: str = "grpo"
    # The discount of the rewards of later turns: G_t = r_t + gamma * G_{t+1} (1: their sum,
    # each turn's return the rest of the episode's; single-turn runs: no effect).
    gamma: float = 1.0
    dynamic_sampling: int = 0  # DAPO's: batches more a step may play to replace flat groups
    # DAPO's soft overlong penalty over the last this many tokens of the response budget;
    # None: a sixth of it for single-turn runs, none for multi-turn and agent runs (whose
    # policy tokens add up over turns), 0: off (llm_gym.train.advantages.overlong_tokens). A third
    # rescued float32's seed 0 and cost bfloat16's seed 7; a sixth kept both (docs/training.md,
    # "A recipe over eight seeds").
    overlong_cache: int | None = None
    mask_truncated: bool = False  # responses the budget cut out of the loss (TRL's option)
    # The rate warmed up, then decayed to 0 along a half cosine (docs/training.md, "A recipe
    # over eight seeds"); warm-up None: a tenth of the optimizer steps, rounded down, for a
    # decaying schedule, none for a constant one.
    lr_schedule: str = "cosine"
    warmup_steps: int | None = None
    update_epochs: int = 1
    minibatch_size: int = 8  # responses per forward in the update, at most
    # The update's memory: tokens per forward at most, and activation checkpointing (None:
    # on CUDA where a micro-batch's activations would not fit in the free memory; on the CPU
    # for micro-batches of min(CHECKPOINT_TOKENS, half the budget) tokens or more).
    max_tokens_per_microbatch: int = 4096
    gradient_checkpointing: bool | None = None
    # The update's arithmetic (PRECISIONS); --dtype is what sampling and the reference run in.
    precision: str = "auto"
    # Each micro-batch's sequences packed into one row (llm_gym.lm.packing): no padding
    # computed, the budget counts real tokens; the loss and gradients are the padded ones.
    packing: bool = True
    # Dropout in the loss's forwards (the model's own, LoRA's): off by default, as TRL's
    # disable_dropout, so that the ratio compares the policy with itself, not two dropout
    # masks; sampling, the old policy and the reference run without it either way.
    keep_dropout: bool = False
    clip_coef: float = 0.2
    # GRPO as TRL 1.16 runs it (llm_gym.train.loss; docs/training.md, "Loss variants"): the
    # loss's aggregation, clip-higher's upper ε (cispo: its cap on the ratio), two-sided
    # clipping's cap, GSPO's sequence ratio, the k3 KL term in the loss against the starting
    # model (beside kl_coef's penalty in the reward), how advantages are scaled, and the cap
    # of the truncated importance weights to the sampler's log-probs (None: off).
    loss_type: str = "dapo"
    clip_coef_high: float | None = None
    delta: float | None = None
    importance_sampling_level: str = "token"
    kl_loss_coef: float = 0.0
    scale_rewards: str = "group"
    tis_cap: float | None = None
    max_grad_norm: float = 1.0
    # An entropy bonus in the loss, as TRL's entropy_coef; given entropy_target, TRL's
    # adaptive control (llm_gym.train.loss.EntropyBonus) with its delta and bounds.
    entropy_coef: float = 0.0
    entropy_target: float | None = None
    entropy_coef_delta: float = 0.005
    entropy_coef_min: float = 0.0
    entropy_coef_max: float = 1.0
    kl_target: float | None = None  # adaptive controller's target KL; None: constant coef
    kl_horizon: int = 10000
    eval_episodes: int = 64
    eval_seed: int = 1_000_003  # held out: the training stream's seed is `seed`
    save_every: int = 10
    keep_checkpoints: int = 2  # the newest ones; older are deleted once a new one is complete
    # The optimizer's state in checkpoints (None: in all but the run's last, which holds the
    # weights alone), and the dtype of weights saved alone (None: the training dtype).
    save_optimizer: bool | None = None
    save_dtype: str | None = None
    # LoRA (peft): the adapters' rank (0: every weight trains), alpha (None: 2 · rank),
    # dropout (with keep_dropout only), and the modules they wrap (None: peft's for the
    # model's family).
    lora_rank: int = 0
    lora_alpha: float | None = None
    lora_dropout: float = 0.0
    lora_target_modules: list[str] | str | None = None
    resume: bool = False
    max_staleness: int = 1  # --async: updates a batch may be sampled ahead of its own
    # An agent program (module:function) that plays each item through llm_gym's gateway
    # (llm_gym.agents): runs at once, and seconds a run may take.
    agent: str | None = None
    num_agents: int = 16
    agent_timeout: float = 300.0

    def __post_init__(self) -> None:
        positive = (
            "iterations", "groups", "update_epochs", "minibatch_size", "save_every",
            "max_tokens_per_microbatch",
        )  # fmt: skip
        for name in (*positive, "kl_horizon", "keep_checkpoints"):
            check_int(name, getattr(self, name), 1)
        if self.gradient_checkpointing is not None:
            check_bool("gradient_checkpointing", self.gradient_checkpointing)
        check_choice("precision", self.precision, PRECISIONS)
        check_bool("packing", self.packing)
        check_bool("keep_dropout", self.keep_dropout)
        if self.precision == "bf16" and self.dtype not in ("auto", "bfloat16"):
            raise ValueError(
                f"precision 'bf16' trains bfloat16 weights, which sample and score in bfloat16: "
                f"dtype must be 'bfloat16' or 'auto', got {self.dtype!r}"
            )
        check_int("lora_rank", self.lora_rank, 0)
        check_number("lora_alpha", self.lora_alpha, 0, strict=True, optional=True)
        check_number("lora_dropout", self.lora_dropout, 0)
        if self.lora_dropout >= 1:
            raise ValueError(f"lora_dropout must be below 1, got {self.lora_dropout}")
        lora_given = (self.lora_alpha, self.lora_dropout or None, self.lora_target_modules)
        if not self.lora_rank and any(value is not None for value in lora_given):
            raise ValueError(
                "lora_alpha, lora_dropout and lora_target_modules (--lora-*) shape LoRA's "
                "adapters: pass lora_rank (--lora-rank) > 0"
            )
        if self.save_optimizer is not None:
            check_bool("save_optimizer", self.save_optimizer)
        if self.save_dtype is not None:
            check_choice("save_dtype", self.save_dtype, DTYPE_NAMES)
        check_int("group_size", self.group_size, 2)  # one response has no group to compare
        check_int("eval_episodes", self.eval_episodes, 0)
        check_int("max_staleness", self.max_staleness, 0)
        if self.groups * self.group_size > MAX_ENVS:  # a sub-env per response
            raise ValueError(
                f"groups × group_size = {self.groups} × {self.group_size} = "
                f"{self.groups * self.group_size} (--groups, --group-size) is more than the "
                f"{MAX_ENVS} sub-envs a run steps at once"
            )
        for name in ("learning_rate", "clip_coef", "max_grad_norm", "temperature"):
            check_number(name, getattr(self, name), 0, strict=True)
        self._check_loss()
        super().__post_init__()
        check_number("kl_target", self.kl_target, 0, strict=True, optional=True)
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
        check_int("num_agents", self.num_agents, 1)
        check_number("agent_timeout", self.agent_timeout, 0, strict=True)
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

    @property
    def max_response_tokens(self) -> int:
        """The most tokens a response may hold: ``max_new_tokens`` a turn (dr_grpo's
        constant, and the length the memory check sizes a batch by)."""
        return self.max_new_tokens * (self.max_tool_calls + 1 if self.tools else 1)

    def _check_loss(self) -> None:
        check_choice("loss_type", self.loss_type, LOSS_TYPES)
        check_choice("importance_sampling_level", self.importance_sampling_level,
                     IMPORTANCE_SAMPLING_LEVELS)  # fmt: skip
        check_choice("scale_rewards", self.scale_rewards, SCALE_REWARDS)
        check_choice("lr_schedule", self.lr_schedule, LR_SCHEDULES)
        check_choice("advantage", self.advantage, ADVANTAGE_ESTIMATORS)
        if not 0 < check_number("gamma", self.gamma, 0, strict=True) <= 1:
            raise ValueError(f"gamma (--gamma) must be in (0, 1], got {self.gamma!r}")
        check_int("dynamic_sampling", self.dynamic_sampling, 0)
        check_int("overlong_cache", self.overlong_cache, 0, optional=True)
        if (self.overlong_cache or 0) > self.max_response_tokens:
            raise ValueError(
                f"overlong_cache (--overlong-cache) must be at most the response budget "
                f"{self.max_response_tokens} (--max-new-tokens), got {self.overlong_cache}"
            )
        if self.dynamic_sampling and self.asynchronous:
            raise ValueError(
                "dynamic_sampling (--dynamic-sampling) with --async: batches sampled ahead "
                "cannot be refilled; drop one"
            )
        check_int("warmup_steps", self.warmup_steps, 0, optional=True)
        check_number("clip_coef_high", self.clip_coef_high, 0, strict=True, optional=True)
        check_number("kl_loss_coef", self.kl_loss_coef, 0)
        check_number("entropy_target", self.entropy_target, 0, optional=True)
        check_number("entropy_coef_delta", self.entropy_coef_delta, 0, strict=True)
        check_number("entropy_coef_min", self.entropy_coef_min, 0)
        check_number("entropy_coef_max", self.entropy_coef_max, self.entropy_coef_min)
        check_number("entropy_coef", self.entropy_coef, 0)
        if self.entropy_target is not None and not (
            self.entropy_coef_min <= self.entropy_coef <= self.entropy_coef_max
        ):
            raise ValueError(
                f"entropy_coef (--entropy-coef) starts the adaptive control within "
                f"[{self.entropy_coef_min}, {self.entropy_coef_max}] (--entropy-coef-min, "
                f"--entropy-coef-max), got {self.entropy_coef}"
            )
        check_number("tis_cap", self.tis_cap, 0, strict=True, optional=True)
        check_number("delta", self.delta, 1, strict=True, optional=True)
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

    def check_start(self, done: int) -> None:
        """That a resumed run whose checkpoint has ``done`` iterations has some left."""
        if done >= self.iterations:
            raise ValueError(
                f"the run in {self.out} has done {done} iterations; pass --iterations above "
                f"{done} to train on"
            )

    def check_given(self, model: Any, tokenizer: Any, env: Any, world: int) -> None:
        """What a library run's ``model``, ``tokenizer`` and ``env`` objects (None: not
        given; an env id is no object) allow with this config across ``world`` processes."""
        if (model is None) != (tokenizer is None):
            given, missing = ("model", "tokenizer") if tokenizer is None else ("tokenizer", "model")
            raise ValueError(
                f"{given} was given without its {missing}: pass a model object and its "
                "tokenizer together, or neither (config.model names the model)"
            )
        if model is not None:  # given objects: what they are is checked where they come in
            import torch
            from transformers import PreTrainedTokenizerBase

            if not isinstance(model, torch.nn.Module):
                raise TypeError(
                    f"model must be a torch.nn.Module (a transformers or peft model), got "
                    f"{type(model).__name__}"
                )
            if not isinstance(tokenizer, PreTrainedTokenizerBase):
                raise TypeError(
                    f"tokenizer must be a transformers tokenizer, got {type(tokenizer).__name__}"
                )
            if not any(p.requires_grad for p in model.parameters()):
                raise ValueError(
                    "model has no parameter that requires grad, so nothing would train: "
                    "unfreeze it (model.requires_grad_(True)) or give a peft model with adapters"
                )
            weights = next(model.parameters()).dtype
            if weights == torch.float16:  # no loss scaling here: its gradients would underflow
                raise ValueError(
                    "model holds float16 weights, which train only with loss scaling (not "
                    "done here): give it in bfloat16 or float32 (model.to(torch.bfloat16))"
                )
            # Weights below float32 sample, score and train in their own dtype.
            if weights != torch.float32 and self.dtype not in ("auto", str(weights)[6:]):
                raise ValueError(
                    f"dtype={self.dtype!r} asks another dtype than the model's {weights}, "
                    "which samples and scores in its own: pass dtype='auto' or cast the "
                    "model (model.float() for float32)"
                )
        import gymnasium

        if env is not None and not (callable(env) or isinstance(env, gymnasium.vector.VectorEnv)):
            raise TypeError(
                f"env must be an env id, a gymnasium VectorEnv or a callable making one, got "
                f"{type(env).__name__}"
            )
        if self.resume and (model is not None or env is not None):
            raise ValueError(
                "resume reloads a run from its folder by name; a model or env object cannot "
                "be resumed into: resume with GRPOTrainer(GRPOConfig.resumed(out))"
            )
        if env is not None:
            given = [flag for name, flag in _ENV_OBJECT_CONFLICTS if getattr(self, name)]
            if set(rubric_weights(self.rubric)) - {"task"}:  # parts beyond the task's reward
                given.append("--rubric")
            if given:
                raise ValueError(
                    f"env as an object does not go with {', '.join(given)}, which make envs "
                    "of their own from config.env: pass the env id, or leave them off "
                    "(eval_episodes=0; evaluate with trainer.evaluate() on an id's run)"
                )
        if world > 1 and (model is not None or env is not None):
            raise ValueError(
                f"a run across {world} processes does not go with a model or env object yet: "
                "run it in one process"
            )

    @classmethod
    def resumed(cls, out: str | Path, **changes: object) -> GRPOConfig:
        """The config of the run saved in ``out``, set to resume, with ``changes`` (fields of
        ``RESUMABLE`` only; others must equal the saved values)."""
        changes.update(out=str(out), resume=True, overwrite=False)
        config = dataclasses.replace(load_config(out), **changes)
        check_resumable(config)
        return config

    def save(self) -> Path:
        """Write this config as JSON into its run folder ``out``; the file's path."""
        text = json.dumps(dataclasses.asdict(self), indent=2) + "\n"
        return write_text(Path(self.out) / CONFIG_FILE, text)


def load_config(out: str | Path) -> GRPOConfig:
    """The ``GRPOConfig`` a run saved in its folder ``out``; a one-line error naming the file
    when it is missing or broken."""
    path = Path(out) / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"--resume needs an earlier run in {out}, but its run config {path} does not "
            "exist (train once without --resume first)"
        )
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
        names = {f.name for f in dataclasses.fields(GRPOConfig)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ValueError(f"unknown fields {unknown}")
        return GRPOConfig(**values)
    except (ValueError, TypeError) as error:  # JSONDecodeError is a ValueError
        message = " ".join(str(error).split())
        raise ValueError(
            f"the run config {path} is truncated or not a GRPOConfig: {message}"
        ) from None


def resume_conflicts(saved: GRPOConfig, config: GRPOConfig) -> list[str]:
    """The fields outside ``RESUMABLE`` in which ``config`` differs from the ``saved`` run's."""
    return [
        f.name
        for f in dataclasses.fields(GRPOConfig)
        if f.name not in RESUMABLE and getattr(saved, f.name) != getattr(config, f.name)
    ]


def check_resumable(config: GRPOConfig) -> GRPOConfig:
    """The saved config of the run ``config`` resumes (in ``config.out``); a one-line error
    naming the first field outside ``RESUMABLE`` that differs from it."""
    saved = load_config(config.out)
    for name in resume_conflicts(saved, config):
        changeable = ", ".join(n for n in RESUMABLE if n not in ("out", "resume", "overwrite"))
        raise ValueError(
            f"{name}={getattr(config, name)!r} differs from the resumed run's "
            f"{name}={getattr(saved, name)!r} ({Path(config.out) / CONFIG_FILE}); a resumed "
            f"run may change only {changeable}"
        )
    return saved


def check_vector_env(
    config: GRPOConfig, envs: gym.vector.VectorEnv, world: int, multi_turn: bool
) -> None:
    """What the run's vector env must be: a sub-env per response observing the trainer's
    keys, and single-turn across processes (``multi_turn``: whether its episodes may take
    more than one response)."""
    size = config.groups * config.group_size // world
    if envs.num_envs != size:
        raise ValueError(
            f"env has {envs.num_envs} sub-envs; the run steps groups × group_size = "
            f"{config.groups} × {config.group_size} = {size}, a sub-env per response"
        )
    keys = getattr(envs.single_observation_space, "spaces", {})
    if not set(_TRAINER_KEYS) <= set(keys):
        raise ValueError(
            "env must observe 'tokens', 'history' and 'policy_mask' (input_mode='tokens', "
            "observation_keys=('tokens', 'history', 'policy_mask')), got the keys "
            f"{sorted(keys)}"
        )
    if multi_turn and config.dynamic_sampling:
        raise ValueError(
            f"{config.env} plays more than one turn an episode, whose iterations reseed "
            "their groups: dynamic_sampling (--dynamic-sampling) refills single-turn tasks"
        )
    if multi_turn and world > 1:
        raise ValueError(
            f"{config.env} plays more than one turn an episode (tools, a game, max_turns), "
            "which a run across processes does not train yet: run it in one process"
        )


def check_episode_groups(prompts: Sequence[object], group_size: int) -> None:
    """That each group of ``group_size`` consecutive episodes (given by their ``prompts``)
    played one item: GRPO compares a group's responses."""
    for start in range(0, len(prompts), group_size):
        played = {json.dumps(p, sort_keys=True, default=str)
                  for p in prompts[start : start + group_size]}  # fmt: skip
        if len(played) > 1:
            raise ValueError(
                f"env's sub-envs {start}..{start + group_size - 1} (one group) played "
                f"{len(played)} different prompts; a group must play one item: make the "
                f"vector env with repeats={group_size}, group_repeats=True"
            )
