"""The ``llm-gym`` command (also ``python -m llm_gym``); each subcommand's help says what it
does. Bad input gets a one-line ``llm-gym: error: ...`` and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

import gymnasium as gym

import llm_gym
from llm_gym.cli._args import (
    Parser,
    add_run_options,
    check_flags,
    check_task_env,
    given_options,
    llm_gym_env_ids,
    make_config,
    number,
    overlong,
    resumed_config,
    usage_error,
)
from llm_gym.cli._check_template import add_check_template, check_template
from llm_gym.cli._envs import envs_table
from llm_gym.cli._launch import LAUNCHED, launch, processes
from llm_gym.cli._servers import add_gateway, add_serve, gateway, serve
from llm_gym.run.config import DTYPE_NAMES, RolloutConfig
from llm_gym.run.signals import exit_code, interruptible, launcher_gone, watch_launcher
from llm_gym.train.config import (
    ADVANTAGE_ESTIMATORS,
    IMPORTANCE_SAMPLING_LEVELS,
    LOSS_TYPES,
    LR_SCHEDULES,
    PRECISIONS,
    SCALE_REWARDS,
    GRPOConfig,
)

# Nothing above imports torch: each command imports what it runs (``--help`` and ``envs``
# answer in well under a second).
__all__ = ["build_parser", "eval_line", "given_options", "llm_gym_env_ids", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The ``llm-gym`` parser with its subcommands."""
    parser = Parser(prog="llm-gym", description="Gymnasium environments for LLM RL.")
    parser.add_argument("--version", action="version", version=f"llm-gym {llm_gym.__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    _add_rollout(commands)
    _add_train(commands)
    add_serve(commands)
    add_gateway(commands)
    commands.add_parser(
        "envs",
        help="list the registered environments: task, spaces, where the data comes from",
        description="A table of the registered ids; makes no env and loads no data.",
    )
    add_check_template(commands)
    return parser


def _add_rollout(commands: Any) -> None:
    parser = commands.add_parser(
        "rollout",
        help="run a model on a chat task; write episodes.jsonl, summary.json and a plot",
        description="Run a model on a registered chat task with the policy adapter and, given "
        "--ref-model, the KL reward wrapper.",
    )
    add, defaults = add_run_options(parser, RolloutConfig)
    add("--split", default=None, help="data split of dataset tasks (GSM8K, MATH; "
        "default: %(default)s, the task's: train)")  # fmt: skip
    add("--data-dir", default=None, help="folder with a dataset task's data files "
        "(GSM8K: train.jsonl/test.jsonl; default: %(default)s, $LLM_GYM_GSM8K_PATH or "
        "$LLM_GYM_MATH_PATH, else the Hub)")  # fmt: skip
    add("--num-envs", type=number(int, 1), default=defaults.num_envs,
        help="envs stepped together, one batched generation a step")  # fmt: skip
    add("--episodes", type=number(int, 1), default=None,
        help="episodes to run (default: %(default)s, one epoch of a dataset split, each "
        "question exactly once across the envs; 64 for procedural tasks)")  # fmt: skip
    add("--ref-model", default=None, help="reference model for the KL penalty ('default' or a "
        "folder; default: %(default)s, no KL charged)")  # fmt: skip
    parser.set_defaults(config=RolloutConfig, job=_prepare_rollout, run=_rollout,
                        kept=_episodes_kept)  # fmt: skip


def _episodes_kept(out: str) -> str:
    return f"finished episodes are in {out}/episodes.jsonl"


def _prepare_rollout(config: RolloutConfig) -> Any:
    from llm_gym.run.rollout import Rollout

    return Rollout(config)


def _rollout(rollout: Any) -> int:
    summary = rollout.run()
    print(summary.table())
    print(f"wrote {rollout.out}/episodes.jsonl, summary.json, rollout.png")
    return 0


def _add_train(commands: Any) -> None:
    parser = commands.add_parser(
        "train",
        help="train a model with GRPO on a chat task; write metrics, a plot and checkpoints",
        description="GRPO through the native vector env: groups of responses per question, "
        "group-relative advantages, the clipped surrogate, an optional KL penalty against the "
        "starting model (--kl-coef > 0).",
    )
    add, defaults = add_run_options(parser, GRPOConfig)
    add("--iterations", type=number(int, 1), default=defaults.iterations,
        help="GRPO iterations: sample the groups, then update")  # fmt: skip
    add("--groups", type=number(int, 1), default=defaults.groups,
        help="questions per iteration")  # fmt: skip
    add("--group-size", type=number(int, 2), default=defaults.group_size,
        help="responses per question")  # fmt: skip
    add("--learning-rate", type=number(float, 0.0, False), default=defaults.learning_rate,
        help="AdamW's learning rate")  # fmt: skip
    add("--update-epochs", type=number(int, 1), default=defaults.update_epochs,
        help="passes over an iteration's responses")  # fmt: skip
    add("--minibatch-size", type=number(int, 1), default=defaults.minibatch_size,
        help="responses per forward in the update (memory, not the math)")  # fmt: skip
    add("--max-tokens-per-microbatch", type=number(int, 1),
        default=defaults.max_tokens_per_microbatch,
        help="tokens per forward in the update, at most (memory, not the math: a "
        "batch is split into micro-batches, shortest first, their gradients summed)")  # fmt: skip
    add("--gradient-checkpointing", action=argparse.BooleanOptionalAction,
        default=defaults.gradient_checkpointing,
        help="keep only each layer's input in the update and recompute the rest in the "
        "backward (less memory, about a third more time; default: %(default)s, on CUDA where "
        "a micro-batch's activations would not fit in the free memory, on the CPU for "
        "micro-batches of 2048 tokens or half the budget, if less, or more)")  # fmt: skip
    add("--packing", action=argparse.BooleanOptionalAction, default=defaults.packing,
        help="pack each micro-batch's responses into one row: no padding computed, the same "
        "loss and gradients (default: %(default)s)")  # fmt: skip
    add("--keep-dropout", action="store_true",
        help="dropout in the update's loss forwards (the model's own and --lora-dropout); "
        "off by default, as in TRL: sampling, the old policy and the reference run without "
        "it either way")  # fmt: skip
    add("--precision", choices=PRECISIONS, default=defaults.precision,
        help="how the update computes: fp32; bf16-mixed (float32 weights and AdamW, bfloat16 "
        "autocast); bf16 (bfloat16 weights, float32 masters in AdamW); auto: bf16-mixed on a "
        "GPU with bfloat16, fp32 elsewhere (default: %(default)s)")  # fmt: skip
    add("--clip-coef", type=number(float, 0.0, False), default=defaults.clip_coef,
        help="the surrogate's ratio clip: 1 +- this")  # fmt: skip
    # GRPO as TRL runs it (docs/training.md, "Loss variants").
    add("--loss-type", choices=LOSS_TYPES, default=defaults.loss_type,
        help="how the per-token losses add up, as TRL's loss_type "
        "(default: %(default)s)")  # fmt: skip
    add("--clip-coef-high", type=number(float, 0.0, False), default=None,
        help="clip-higher: the ratio's upper clip 1 + this (default: %(default)s, "
        "--clip-coef); for cispo, the cap on the ratio (5.0 in MiniMax's recipe)")  # fmt: skip
    add("--delta", type=number(float, 1.0, False), default=None,
        help="two-sided clipping: cap the unclipped ratio at this too (default: %(default)s, "
        "off)")  # fmt: skip
    add("--importance-sampling-level", choices=IMPORTANCE_SAMPLING_LEVELS,
        default=defaults.importance_sampling_level,
        help="the ratio per token, or per response (GSPO; default: %(default)s)")  # fmt: skip
    add("--kl-loss-coef", type=number(float, 0.0), default=defaults.kl_loss_coef,
        help="beta: the k3 KL to the starting model in the loss, as TRL's (the adapter "
        "disabled under LoRA; beside --kl-coef's penalty in the reward; default: "
        "%(default)s)")  # fmt: skip
    add("--entropy-coef", type=number(float, 0.0), default=defaults.entropy_coef,
        help="an entropy bonus: the loss less this times the mean per-token entropy, as "
        "TRL's entropy_coef; with --entropy-target, its starting value (default: "
        "%(default)s, off)")  # fmt: skip
    add("--entropy-target", type=number(float, 0.0), default=None,
        help="TRL's adaptive entropy control: after each step the coefficient rises by "
        "--entropy-coef-delta while the entropy is at or below this, falls above it, and "
        "applies only at or below it (default: %(default)s, off)")  # fmt: skip
    add("--entropy-coef-delta", type=number(float, 0.0, False),
        default=defaults.entropy_coef_delta,
        help="the adaptive coefficient's step (default: %(default)s)")  # fmt: skip
    add("--entropy-coef-min", type=number(float, 0.0), default=defaults.entropy_coef_min,
        help="the adaptive coefficient's floor (default: %(default)s)")  # fmt: skip
    add("--entropy-coef-max", type=number(float, 0.0), default=defaults.entropy_coef_max,
        help="the adaptive coefficient's ceiling (default: %(default)s)")  # fmt: skip
    add("--advantage", choices=ADVANTAGE_ESTIMATORS, default=defaults.advantage,
        help="each response's advantage from its group's rewards: GRPO's group-normalised, "
        "RLOO's leave-one-out or REINFORCE++'s baseline (one value for the episode); per "
        "turn of a multi-turn episode: rebn, GEM's discounted returns normalised over the "
        "batch, or turn-grpo, normalised within the group turn by turn (default: "
        "%(default)s)")  # fmt: skip
    add("--gamma", type=number(float, 0.0, False), default=defaults.gamma,
        help="the discount of later turns' rewards, G_t = r_t + gamma G_{t+1}, at most 1 "
        "(GEM takes 0.9 for games; default: %(default)s, their sum)")  # fmt: skip
    add("--dynamic-sampling", type=number(int, 0), default=defaults.dynamic_sampling,
        metavar="N", help="DAPO's dynamic sampling: up to N more batches a step, whose "
        "groups replace those whose rewards are all equal (default: %(default)s, off)")  # fmt: skip
    cache = "auto" if defaults.overlong_cache is None else defaults.overlong_cache  # typed
    add("--overlong-cache", type=overlong, default=cache,
        metavar="TOKENS", help="DAPO's soft overlong penalty: a response's reward falls "
        "linearly to -1 over its last TOKENS of --max-new-tokens; 0: off; auto: a sixth "
        "of the budget for single-turn runs, off for multi-turn and agent runs (default: "
        "%(default)s)")  # fmt: skip
    add("--max-grad-norm", type=number(float, 0.0, False), default=defaults.max_grad_norm,
        help="the gradient's norm is clipped to this before each step, as TRL's "
        "max_grad_norm (default: %(default)s)")  # fmt: skip
    add("--mask-truncated", action="store_true",
        help="leave responses that --max-new-tokens cut out of the loss and its token count, "
        "as TRL's mask_truncated_completions (default: %(default)s, they train)")  # fmt: skip
    add("--lr-schedule", choices=LR_SCHEDULES, default=defaults.lr_schedule,
        help="the learning rate over the optimizer steps: held, or decayed to 0 linearly or "
        "along a half cosine (default: %(default)s)")  # fmt: skip
    add("--warmup-steps", type=number(int, 0), default=defaults.warmup_steps,
        help="optimizer steps of linear warm-up from 0 first (default: %(default)s, a tenth "
        "of the optimizer steps, rounded down, for linear and cosine; none for "
        "constant)")  # fmt: skip
    add("--scale-rewards", choices=SCALE_REWARDS, default=defaults.scale_rewards,
        help="advantages divided by the group's reward std, the batch's, or none "
        "(default: %(default)s)")  # fmt: skip
    add("--tis-cap", type=number(float, 0.0, False), default=None,
        help="truncated importance sampling: weigh each token by min(exp(trainer's old "
        "log-prob - the sampler's), this), as TRL's token_truncate (default: "
        "%(default)s, off)")  # fmt: skip
    add("--kl-target", type=number(float, 0.0, False), default=None,
        help="adaptive KL controller's target (default: %(default)s, a constant "
        "coefficient)")  # fmt: skip
    add("--eval-episodes", type=number(int, 0), default=defaults.eval_episodes,
        help="greedy episodes on held-out questions before and after (0: none)")  # fmt: skip
    add("--save-every", type=number(int, 1), default=defaults.save_every,
        help="iterations between checkpoints")  # fmt: skip
    add("--keep-checkpoints", type=number(int, 1), default=defaults.keep_checkpoints,
        help="the newest checkpoints kept in --out (older ones are deleted)")  # fmt: skip
    add("--max-staleness", type=number(int, 0), default=defaults.max_staleness,
        help="--async/--ray: updates a batch may be sampled ahead of the update that trains "
        "on it (default: %(default)s; 0: no overlap)")  # fmt: skip
    add("--lora-rank", type=number(int, 0), default=defaults.lora_rank,
        help="train LoRA adapters of this rank (peft) instead of every weight; the KL's "
        "reference is the model with its adapter disabled, checkpoints hold the adapter "
        "(default: %(default)s, no LoRA)")  # fmt: skip
    add("--lora-alpha", type=number(float, 0.0, False), default=None,
        help="LoRA's alpha (default: %(default)s, 2 x --lora-rank)")  # fmt: skip
    add("--lora-dropout", type=number(float, 0.0), default=defaults.lora_dropout,
        help="dropout on LoRA's input, in the loss's forwards with --keep-dropout only "
        "(default: %(default)s)")  # fmt: skip
    add("--lora-target-modules", type=_names, default=None, metavar="NAMES",
        help="comma-separated module names the adapters wrap, or 'all-linear' (default: "
        "%(default)s, peft's for the model's family: q_proj,v_proj for Llama, "
        "Qwen2)")  # fmt: skip
    add("--save-optimizer", action=argparse.BooleanOptionalAction, default=None,
        help="the optimizer's state in checkpoints, what an exact --resume needs (twice the "
        "weights with AdamW; default: %(default)s, in all but the run's last, which holds "
        "the weights alone)")  # fmt: skip
    add("--save-dtype", choices=DTYPE_NAMES, default=None,
        help="the dtype of weights saved without the optimizer's state (default: "
        "%(default)s, the trained weights' dtype)")  # fmt: skip
    add("--agent", default=None, metavar="MODULE:FUNCTION",
        help="train an agent program: FUNCTION(base_url, api_key, item) -> answer (in MODULE "
        "or a file.py), which calls the model through llm_gym's OpenAI-compatible gateway; "
        "each call is recorded token for token and the task's reward scores the answer "
        "(docs/agents.md; default: %(default)s, the env's own turns)")  # fmt: skip
    add("--num-agents", type=number(int, 1), default=defaults.num_agents,
        help="--agent: runs at once (default: %(default)s)")  # fmt: skip
    add("--agent-timeout", type=number(float, 0.0, False), default=defaults.agent_timeout,
        metavar="SECONDS", help="--agent: seconds a run may take; past it the run scores 0 "
        "with its error (default: %(default)s)")  # fmt: skip
    add("--resume", action="store_true", help="continue from the checkpoint in --out")
    # Past one device: torchrun's own flags (docs/many-gpus.md).
    add("--nproc-per-node", type=number(int, 1), default=1, metavar="N",
        help="processes on this machine, one GPU each (gloo on the CPU): the update sharded "
        "with FSDP2, the groups split between them (default: %(default)s)")  # fmt: skip
    add("--nnodes", type=number(int, 1), default=1, metavar="M",
        help="machines in the run, each launching --nproc-per-node processes (default: "
        "%(default)s)")  # fmt: skip
    add("--node-rank", type=number(int, 0), default=0,
        help="this machine's rank among --nnodes, 0 to M-1 (default: %(default)s)")  # fmt: skip
    add("--master-addr", default=None, metavar="HOST",
        help="the address of --node-rank 0's machine, which every machine can reach "
        "(default: %(default)s, one machine, a local rendezvous)")  # fmt: skip
    add("--master-port", type=number(int, 1), default=None, metavar="PORT",
        help="a free port on --master-addr's machine, 29500 if not given; on one machine "
        "without --master-addr, the rendezvous's port on this one (default: %(default)s, a "
        "free one)")  # fmt: skip
    parser.set_defaults(config=GRPOConfig, job=_prepare_train, run=_train,
                        kept=_iterations_kept)  # fmt: skip


def _names(text: str) -> list[str] | str:
    """``--lora-target-modules``: ``all-linear`` or comma-separated module names."""
    if text.strip() == "all-linear":
        return "all-linear"
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names or not all(name.replace("_", "").replace(".", "").isalnum() for name in names):
        raise argparse.ArgumentTypeError(
            f"expected 'all-linear' or comma-separated module names, got {text!r}"
        )
    return names


def _iterations_kept(out: str) -> str:
    # Read from the folder: --resume is offered only where a checkpoint is there to resume.
    from llm_gym.train.run_folder import resume_hint

    return resume_hint(out)


def _prepare_train(config: GRPOConfig) -> Any:
    from llm_gym.train.grpo import GRPOTrainer

    return GRPOTrainer(config)


def eval_line(before: dict[str, Any] | None, after: dict[str, Any] | None) -> str | None:
    """The held-out greedy success before and after training, when both were measured (a
    resumed run, or one without evaluation, may lack either); else None."""
    if before is None or after is None:
        return None
    return (
        f"greedy success on held-out questions: {before['success']:.3f} before, "
        f"{after['success']:.3f} after"
    )


def _train(trainer: Any) -> int:
    from llm_gym.train.run_folder import METRICS_FILE, TRAINING_PLOT_FILE

    summary = trainer.train()
    if not trainer.lead:  # across processes, the first one says it
        return 0
    line = eval_line(summary["before"], summary["after"])
    if line is not None:
        print(line)
    if summary.get("parts"):
        means = ", ".join(f"{name} {mean:.3f}" for name, mean in summary["parts"].items())
        print(f"rubric parts (means, last iteration): {means}")
    for name, cost in (summary.get("judges") or {}).items():
        print(f"{name}: {cost['calls']} calls, {cost['tokens']} tokens, {cost['seconds']:.1f} s, "
              f"{cost['cache_hits']} cache hits, {cost['errors']} errors")  # fmt: skip
    print(f"wrote {trainer.out}/{METRICS_FILE}, {TRAINING_PLOT_FILE}, checkpoint-*/, summary.json")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``llm-gym`` with ``argv`` (default: the command line); the exit code."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "envs":
        print(envs_table())
        return 0
    if args.command == "check-template":
        return check_template(args)
    if args.command == "serve":
        return serve(args)
    if args.command == "gateway":
        return gateway(args)
    try:  # flags and values checked before anything heavy loads
        check_task_env(args.env, args.command)
        given = given_options(parser, argv)
        check_flags(args, given)
        if args.command == "train" and args.resume:  # the saved run, not the defaults
            config = resumed_config(args, given)
        else:
            config = make_config(args.config, args)
        world = processes(args, config)
    except (ValueError, OSError) as error:
        return usage_error(error)
    if world > 1 and "WORLD_SIZE" not in os.environ:  # not yet under a launcher
        return launch(args, argv, lambda: args.kept(config.out))
    # Only a run needs torch and transformers (seconds to import).
    import torch
    import transformers

    # A SIGTERM stops a run as Ctrl-C does; a process torchrun started stops with it.
    with interruptible():
        watch_launcher()
        transformers.utils.logging.disable_progress_bar()  # the command draws its own bar
        if args.threads is not None:
            torch.set_num_threads(args.threads)
        return _run(args, config)


def _run(args: argparse.Namespace, config: Any) -> int:
    # The command's run, prepared (models loaded, envs made, folder claimed), then run; its
    # setup's and its end's errors in one line each, from the first process of several.
    from llm_gym.samplers import SamplerError
    from llm_gym.train.sharding import peer_lost

    # The first process of several says how the run ended; under llm-gym's launcher, the
    # launcher says it (it knows whether a process died), unless it is gone.
    def says() -> bool:
        lead = os.environ.get("RANK", "0") == "0"
        return lead and (LAUNCHED not in os.environ or launcher_gone())

    try:
        prepared = args.job(config)
    # Setup errors (bad ids, paths, data, values, a folder in use) are the user's to fix: one
    # line, exit 2.
    except (ValueError, TypeError, OSError, ImportError, gym.error.Error) as error:
        return usage_error(error)
    except SamplerError as error:  # the backend's server did not come up
        return usage_error(error, code=1)
    except KeyboardInterrupt as error:
        if says():
            kept = args.kept(config.out)
            print(f"llm-gym: interrupted while setting up; {kept}", file=sys.stderr)
        return exit_code(error)
    try:
        return args.run(prepared)
    except SamplerError as error:  # the server died or failed: what finished is on disk
        return usage_error(f"{error}; {args.kept(prepared.out)}", code=1)
    except OSError as error:  # a full disk, a read-only or vanished folder: one line
        return usage_error(f"{error}; {args.kept(prepared.out)}", code=1)
    except KeyboardInterrupt as error:  # what the run finished is on disk: say where
        if says():
            print(f"llm-gym: interrupted; {args.kept(prepared.out)}", file=sys.stderr)
        return exit_code(error)
    except RuntimeError as error:  # another process of the run died
        if not peer_lost(error):
            raise
        if says():
            said = str(error).strip().splitlines()[0]
            usage_error(f"another process of the run stopped ({said}); {args.kept(prepared.out)}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
