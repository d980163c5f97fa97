"""Does an agent learn through llm_gym? GRPO on a task, greedy success before and after.

Runs ``llm-gym train``'s job (``GRPOTrainer``) and prints the greedy success on held-out
questions before and after, the gain in points, the minutes it took, and whether it met the
target (``--target-points`` within ``--budget-minutes``). README's learning table is its
output. Defaults: the CPU demo (SmolLM2-135M-Instruct on reasoning-gym's ``chain_sum`` at
level 0, last-number answers).

``--vs-trl`` then trains the same starting model with TRL's ``GRPOTrainer`` on the same task
(through ``llm_gym.integrations.trl``'s ``rollout_func``), with the same GRPO settings and
optimizer (``trl_config``), scores it on the same held-out questions with the same function
(``evaluate_greedy``), plots both reward curves (``--plot``) and ends with one line per
trainer: ``NAME: before -> after (SE of after), minutes``.

    python scripts/bench_learning.py                                   # 2-core CPU demo
    python scripts/bench_learning.py --device cuda --groups 8 --iterations 70 \\
        --task basic_arithmetic --target-points 0 --target-success 0.6
    python scripts/bench_learning.py --vs-trl --plot docs/assets/learning-vs-trl.png
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import transformers

from llm_gym.lm.loading import DEFAULT_MODEL_NAME, load_model
from llm_gym.run.setup import compute_dtype, env_kwargs, resolve_device
from llm_gym.train import GRPOConfig, GRPOTrainer
from llm_gym.train.advantages import overlong_tokens
from llm_gym.train.config import LOSS_TYPES
from llm_gym.train.evaluation import evaluate_greedy
from llm_gym.train.optim import TRANSFORMERS_SCHEDULES, warmup_steps
from llm_gym.train.update import PRECISION_WEIGHTS, resolve_precision

if TYPE_CHECKING:  # trl takes seconds to import: only --vs-trl pays for it
    import trl

# torch.optim.AdamW's defaults, which llm_gym's trainer uses (AdamW(params, lr)).
ADAMW = {"weight_decay": 0.01, "adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-8}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add = parser.add_argument
    add("--task", default="chain_sum", help="the reasoning-gym task")
    add("--level", type=int, default=0)
    add("--answer-format", default="last_number")
    add("--model", default="default")
    add("--iterations", type=int, default=20)
    add("--groups", type=int, default=2)
    add("--group-size", type=int, default=8)
    add("--learning-rate", type=float, default=5e-5)
    add("--max-new-tokens", type=int, default=48)
    add("--eval-episodes", type=int, default=64)
    add("--kl-coef", type=float, default=0.0)
    add("--device", default="auto")
    add("--dtype", default="float32")
    add("--seed", type=int, default=0)
    add("--seeds", type=parse_seeds, default=None, metavar="SEEDS",
        help="a run per seed (0-7, or 0,2,5): a row each, then the worst, mean and best gain; "
             "overrides --seed")  # fmt: skip
    add("--target-points", type=float, default=15.0, help="gain in success, in points")
    add("--target-success", type=float, default=0.0, help="success after, at least")
    add("--budget-minutes", type=float, default=15.0)
    add("--out", default=None, help="run folder (default: a temporary one)")
    add("--vs-trl", action="store_true", help="then the same run with TRL's GRPOTrainer")
    add("--trainers", type=parse_trainers, default=None, metavar="NAMES",
        help="with --seeds, which trainers run each seed: llm_gym, trl (TRL with the same "
        "recipe), trl-defaults (TRL's own recipe at the same budget); default llm_gym, with "
        "--vs-trl llm_gym,trl")  # fmt: skip
    add("--loss-type", default=GRPOConfig.loss_type, choices=LOSS_TYPES,
        help="GRPO's loss aggregation (TRL's names)")  # fmt: skip
    add("--plot", default="docs/assets/learning-vs-trl.png", help="--vs-trl's figure")
    add("--set", action="append", default=[], type=config_change, metavar="FIELD=VALUE",
        help="any other GRPOConfig field (VALUE in JSON, else a string), e.g. "
        "lr_schedule=cosine; repeatable")  # fmt: skip
    args = parser.parse_args(argv)
    if args.trainers is not None and args.seeds is None:
        parser.error("--trainers picks the trainers of each seed: pass --seeds too")
    compares = args.vs_trl or any(name != "llm_gym" for name in args.trainers or ())
    if compares and args.kl_coef:
        parser.error(
            "--vs-trl compares without KL (llm_gym's is a reward penalty, TRL's a loss term)"
        )
    if compares and args.eval_episodes < 1:
        parser.error("--vs-trl compares held-out success: pass --eval-episodes >= 1")
    return args


def parse_seeds(spec: str) -> list[int]:
    """Seeds from ``"0-7"`` (a range, both ends in) or ``"0,2,5"`` (a list).

    >>> parse_seeds("0-3"), parse_seeds("4,1")
    ([0, 1, 2, 3], [4, 1])
    """
    try:
        if "-" in spec:
            first, last = (int(part) for part in spec.split("-"))
            seeds = list(range(first, last + 1))
        else:
            seeds = [int(part) for part in spec.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--seeds must be FIRST-LAST or a comma-separated list of ints, got {spec!r}"
        ) from None
    if not seeds or min(seeds) < 0:
        raise argparse.ArgumentTypeError(f"--seeds must name seeds >= 0, got {spec!r}")
    return seeds


def config_change(text: str) -> tuple[str, Any]:
    """``FIELD=VALUE`` as a GRPOConfig field and its value (JSON, else the string).

    >>> config_change("warmup_steps=2"), config_change("lr_schedule=cosine")
    (('warmup_steps', 2), ('lr_schedule', 'cosine'))
    """
    field, sep, value = text.partition("=")
    if not sep or field not in {f.name for f in dataclasses.fields(GRPOConfig)}:
        raise argparse.ArgumentTypeError(
            f"--set takes FIELD=VALUE of a GRPOConfig field, got {text!r}"
        )
    try:
        return field, json.loads(value)
    except json.JSONDecodeError:
        return field, value


def run_config(args: argparse.Namespace, out: str) -> GRPOConfig:
    """llm_gym's run of ``args``, in the run folder ``out``."""
    return GRPOConfig(
        env="LLMChat-ReasoningGym-v0", env_args={"task": args.task, "level": args.level},
        answer_format=args.answer_format, model=args.model,
        iterations=args.iterations, groups=args.groups, group_size=args.group_size,
        learning_rate=args.learning_rate, max_new_tokens=args.max_new_tokens,
        eval_episodes=args.eval_episodes, kl_coef=args.kl_coef, device=args.device,
        dtype=args.dtype, seed=args.seed, out=out, overwrite=True, progress=False,
        save_every=args.iterations, loss_type=args.loss_type, **dict(args.set),
    )  # fmt: skip


def trl_config(config: GRPOConfig, out: str, *, own_defaults: bool = False) -> trl.GRPOConfig:
    """TRL's settings for the run ``config`` describes: one generation batch of ``groups``
    questions × ``group_size`` responses per optimizer step, one update on it, the same
    response budget and temperature, the same loss, clip, learning rate and its schedule and
    optimizer (AdamW's defaults), the update in the weights' dtype (no mixed precision); TRL's
    files in ``out``. ``own_defaults``: TRL's own recipe instead (its learning rate, schedule,
    optimizer, loss and clip), at the same budget and dtype."""
    import trl

    if config.kl_coef or config.update_epochs != 1:
        raise ValueError(
            "trl_config compares without KL (llm_gym charges it in the reward) and with one "
            "update per batch"
        )
    # TRL's default is on; llm_gym's (None) turns it on for large micro-batches only, and it
    # changes memory, not the math. transformers 5 renamed it (the old name warns).
    fields = {field.name for field in dataclasses.fields(trl.GRPOConfig)}
    checkpointing = "activation_checkpointing"
    if checkpointing not in fields:
        checkpointing = "gradient_checkpointing"
    recipe = {
        "learning_rate": config.learning_rate,
        "loss_type": config.loss_type,
        "epsilon": config.clip_coef,
        "max_grad_norm": config.max_grad_norm,
        "scale_rewards": config.scale_rewards,
        "optim": "adamw_torch",  # not transformers' default, the fused one
        **ADAMW,
        "lr_scheduler_type": TRANSFORMERS_SCHEDULES[config.lr_schedule],
        "warmup_steps": warmup_steps(config.warmup_steps, config.iterations, config.lr_schedule),
    }
    return trl.GRPOConfig(
        output_dir=out,
        num_generations=config.group_size,
        per_device_train_batch_size=config.groups * config.group_size,
        gradient_accumulation_steps=1,
        steps_per_generation=1,  # each step samples its own batch: no stale responses
        # One update per batch, its ratio 1, as llm_gym's update_epochs=1 (TRL would count
        # each further pass as a step of max_steps).
        num_iterations=1,
        max_steps=config.iterations,
        temperature=config.temperature,
        max_completion_length=config.max_new_tokens,
        beta=0.0,
        seed=config.seed,
        **({} if own_defaults else recipe),
        use_cpu=resolve_device(config.device).type == "cpu",
        # TRL's default is bf16 autocast; llm_gym's update computes in the weights' dtype
        # (--precision auto on a CPU), and both sample in --dtype (run_trl).
        bf16=False,
        fp16=False,
        **{checkpointing: bool(config.gradient_checkpointing)},
        use_vllm=False,
        report_to="none",
        logging_steps=1,  # a reward per iteration
        save_strategy="no",
        disable_tqdm=True,
    )


def standard_error(rate: float, episodes: int) -> float:
    """The standard error of a success ``rate`` measured over ``episodes`` episodes.

    >>> round(standard_error(0.5, 64), 4)
    0.0625
    """
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    return math.sqrt(rate * (1 - rate) / episodes)


def summary_line(name: str, before: float, after: float, episodes: int, minutes: float) -> str:
    """``NAME: before -> after (SE of after), minutes``: the comparison's line per trainer.

    >>> summary_line("trl", 0.25, 0.5, 64, 3.14159)
    'trl: 0.250 -> 0.500 (SE 0.062), 3.1 min'
    """
    se = standard_error(after, episodes)
    return f"{name}: {before:.3f} -> {after:.3f} (SE {se:.3f}), {minutes:.1f} min"


def llm_gym_rewards(rows: Sequence[Mapping[str, Any]]) -> tuple[list[int], list[float]]:
    """Iterations (from 1) and mean training rewards of llm_gym's ``metrics.jsonl`` rows."""
    return [int(row["iteration"]) + 1 for row in rows], [float(row["reward"]) for row in rows]


def trl_rewards(log_history: Sequence[Mapping[str, Any]]) -> tuple[list[int], list[float]]:
    """Steps (from 1) and mean training rewards of TRL's ``trainer.state.log_history`` (its
    last entry, the run's summary, has no reward): the env's reward where TRL logs it apart
    from the others (an overlong penalty's), as llm_gym's rows do."""
    logged = [entry for entry in log_history if "reward" in entry]
    env = "rewards/env_reward_func/mean"
    return [int(entry["step"]) for entry in logged], [
        float(entry.get(env, entry["reward"])) for entry in logged
    ]


def rollout_env_kwargs(config: GRPOConfig, tokenizer: Any) -> dict[str, Any]:
    """The task env's arguments llm_gym's run uses (``env_kwargs``), less the observation's
    mode: the ``rollout_func`` sets its own, with the trainer's tokenizer."""
    kwargs = env_kwargs(config, tokenizer)
    for key in ("input_mode", "tokenizer", "observation_keys"):
        kwargs.pop(key)
    return kwargs


def run_trl(config: GRPOConfig, out: str, *, own_defaults: bool = False) -> dict[str, Any]:
    """TRL's ``GRPOTrainer`` on ``config``'s task from ``config.model`` (``trl_config``'s
    settings), greedy success on the held-out questions before and after (llm_gym's
    ``evaluate_greedy``): ``before``, ``after``, the rewards' ``steps`` and ``rewards``, and
    its ``minutes``. Its weights are llm_gym's (``--precision``'s), and it samples and
    evaluates in llm_gym's compute dtype (``--dtype`` by autocast over float32 weights)."""
    import datasets
    import trl
    from trl.rewards import get_soft_overlong_punishment

    from llm_gym.integrations.trl import env_reward_func, make_rollout_func

    start = time.perf_counter()
    device = resolve_device(config.device)
    weights = PRECISION_WEIGHTS[resolve_precision(config.precision, device)]
    sampling = compute_dtype(config, device, weights)
    torch.manual_seed(config.seed)
    model, tokenizer = load_model(config.model, device=device, dtype=weights)

    def evaluate() -> float:
        model.eval()
        held_out = evaluate_greedy(
            model, tokenizer, config, episodes=config.eval_episodes, seed=config.eval_seed,
            compute_dtype=sampling,
        )  # fmt: skip
        return held_out["success"]

    before = evaluate()
    rollout = make_rollout_func(
        config.env, seed=config.seed, compute_dtype=sampling,
        **rollout_env_kwargs(config, tokenizer),
    )  # fmt: skip
    # The env poses the questions (its own stream from `seed`) and ignores the prompts, but
    # TRL draws `groups` rows a step: one placeholder row per question.
    rows = config.groups * config.iterations
    dataset = datasets.Dataset.from_dict({"prompt": ["(the env poses the question)"] * rows})
    # DAPO's overlong penalty as TRL gives it: a reward function added to the env's.
    cache = overlong_tokens(config.overlong_cache, config.max_new_tokens, single_turn=True)
    penalty = [get_soft_overlong_punishment(config.max_new_tokens, cache)] if cache else []
    trainer = trl.GRPOTrainer(
        model=model, reward_funcs=[env_reward_func, *penalty],
        args=trl_config(config, f"{out}/trl", own_defaults=own_defaults),
        train_dataset=dataset, processing_class=tokenizer, rollout_func=rollout,
    )  # fmt: skip
    trainer.train()
    model = trainer.accelerator.unwrap_model(trainer.model)
    after = evaluate()
    steps, rewards = trl_rewards(trainer.state.log_history)
    minutes = (time.perf_counter() - start) / 60
    return {
        "before": before,
        "after": after,
        "steps": steps,
        "rewards": rewards,
        "minutes": minutes,
    }


def plot_title(config: GRPOConfig) -> str:
    """The figure's title: the task, the model and the settings both trainers share."""
    model = DEFAULT_MODEL_NAME if config.model == "default" else Path(config.model).name
    task = ", ".join(f"{key} {value}" for key, value in config.env_args.items())
    return (
        f"GRPO on reasoning-gym ({task}), {model}\n{config.iterations} iterations of "
        f"{config.groups} groups x {config.group_size} responses, lr {config.learning_rate:g}, "
        f"temperature {config.temperature:g}, {config.max_new_tokens} new tokens, "
        f"loss {config.loss_type}, seed {config.seed}"
    )


def plot_comparison(
    path: str | Path, title: str, curves: Mapping[str, tuple[list[int], list[float], str]]
) -> Path:
    """One figure of each trainer's mean training reward per iteration; ``curves`` maps a
    trainer's name to its iterations, rewards and legend label."""
    import matplotlib

    matplotlib.use("Agg")  # no display: write the file only
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    # Markers and dashes that differ: equal rewards (a small batch's are coarse) overlap.
    for (steps, rewards, label), style in zip(curves.values(), ("o-", "s--", "^:"), strict=False):
        ax.plot(steps, rewards, style, label=label, markersize=4, alpha=0.85)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("iteration")
    ax.set_ylabel("mean training reward")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    return saved(fig, path)


def saved(fig: Any, path: str | Path) -> Path:
    """``fig`` written to ``path`` (its folder made) and closed: the path."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def success_label(name: str, before: float, after: float) -> str:
    """A curve's legend: the trainer and its greedy success before and after."""
    return f"{name} (greedy success {before:.3f} -> {after:.3f})"


SEED_HEADER = (
    "| seed | before | after | gain (points) | SE of gain | minutes | final entropy | "
    "response tokens | zero-variance groups |"
)


def gain_standard_error(before: float, after: float, episodes: int) -> float:
    """The standard error of ``after - before``, two success rates on ``episodes`` questions
    each (taken as independent: an upper bound for the same questions).

    >>> round(gain_standard_error(0.25, 0.5, 128), 4)
    0.0585
    """
    return math.hypot(standard_error(before, episodes), standard_error(after, episodes))


def seed_row(seed: int, summary: Mapping[str, Any], rows: Sequence[Mapping[str, Any]],
             episodes: int, minutes: float) -> dict[str, Any]:  # fmt: skip
    """One seed's numbers: success before and after, the gain (points) and its standard
    error, minutes, the last iteration's entropy, the mean response length and the mean
    share of zero-variance groups over the run."""
    before, after = summary["before"]["success"], summary["after"]["success"]
    return {
        "seed": seed,
        "before": before,
        "after": after,
        "gain": 100 * (after - before),
        "gain_se": 100 * gain_standard_error(before, after, episodes),
        "minutes": minutes,
        # What llm_gym's rows record; None for a trainer without them (TRL).
        "entropy": rows[-1].get("entropy") if rows else None,
        "response_tokens": sum(r["response_tokens"] for r in rows) / len(rows) if rows else None,
        "zero_variance_groups": sum(r.get("zero_variance_groups", 0.0) for r in rows) / len(rows)
        if rows
        else None,
    }


def seed_table(results: Sequence[Mapping[str, Any]]) -> str:
    """The per-seed table in Markdown, then the worst, mean and best gain (with the mean's
    standard error over seeds).

    >>> rows = [{"seed": 0, "before": 0.3, "after": 0.5, "gain": 20.0, "gain_se": 6.0,
    ...          "minutes": 5.0, "entropy": 0.4, "response_tokens": 20.0,
    ...          "zero_variance_groups": 0.25}, {"seed": 1, "before": 0.3, "after": 0.4,
    ...          "gain": 10.0, "gain_se": 6.0, "minutes": 5.0, "entropy": None,
    ...          "response_tokens": 30.0, "zero_variance_groups": 0.5}]
    >>> print(seed_table(rows).splitlines()[-1])
    gain over 2 seeds: worst +10.0, mean +15.0 (SE 5.0), best +20.0
    """
    lines = [SEED_HEADER, "|" + "---|" * SEED_HEADER.count(" | ") + "---|"]

    def cell(value: float | None, digits: int) -> str:
        return "n/a" if value is None else f"{value:.{digits}f}"

    for r in results:
        lines.append(
            f"| {r['seed']} | {r['before']:.3f} | {r['after']:.3f} | {r['gain']:+.1f} | "
            f"{r['gain_se']:.1f} | {r['minutes']:.1f} | {cell(r['entropy'], 3)} | "
            f"{cell(r['response_tokens'], 1)} | {cell(r['zero_variance_groups'], 2)} |"
        )
    gains = [r["gain"] for r in results]
    mean = sum(gains) / len(gains)
    spread = (
        math.sqrt(sum((g - mean) ** 2 for g in gains) / (len(gains) - 1)) if len(gains) > 1 else 0.0
    )
    lines.append(
        f"gain over {len(gains)} seeds: worst {min(gains):+.1f}, mean {mean:+.1f} "
        f"(SE {spread / math.sqrt(len(gains)):.1f}), best {max(gains):+.1f}"
    )
    return "\n".join(lines)


TRAINERS = ("llm_gym", "trl", "trl-defaults")


def parse_trainers(spec: str) -> list[str]:
    """``--trainers``' comma-separated names, each one of ``TRAINERS``.

    >>> parse_trainers("llm_gym,trl")
    ['llm_gym', 'trl']
    """
    names = [name.strip() for name in spec.split(",")]
    unknown = [name for name in names if name not in TRAINERS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"--trainers takes a comma-separated list of {', '.join(TRAINERS)}, got {spec!r}"
        )
    return names


def plot_seeds(
    path: str | Path, title: str, curves: Mapping[str, Sequence[tuple[int, list[int], list[float]]]]
) -> Path:
    """One panel per trainer, a line per seed: the mean training reward per iteration;
    ``curves`` maps a trainer's name to its (seed, iterations, rewards)."""
    import matplotlib

    matplotlib.use("Agg")  # no display: write the file only
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        1, len(curves), figsize=(4.5 * len(curves), 4), sharey=True, squeeze=False
    )
    for ax, (name, runs) in zip(axes[0], curves.items(), strict=True):
        for seed, steps, rewards in runs:
            ax.plot(steps, rewards, "o-", markersize=3, alpha=0.8, label=f"seed {seed}")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("iteration")
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("mean training reward")
    fig.suptitle(title, fontsize=9)
    return saved(fig, path)


def run_seeds(args: argparse.Namespace, out: str) -> dict[str, list[dict[str, Any]]]:
    """Each of ``args.trainers`` (default: llm_gym, and TRL with ``--vs-trl``) on each of
    ``args.seeds`` (run folders ``out/seed-N``): each seed's row, printed as it finishes,
    then a table per trainer and, with more than one trainer, every seed's curve
    (``--plot``)."""
    trainers = args.trainers or (["llm_gym", "trl"] if args.vs_trl else ["llm_gym"])
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in trainers}
    curves: dict[str, list[tuple[int, list[int], list[float]]]] = {name: [] for name in trainers}
    for seed in args.seeds:
        config = dataclasses.replace(run_config(args, f"{out}/seed-{seed}"), seed=seed)
        for name in trainers:
            if name == "llm_gym":
                start = time.perf_counter()
                summary = GRPOTrainer(config).train()
                minutes = (time.perf_counter() - start) / 60
                with open(Path(config.out) / "metrics.jsonl") as f:
                    rows = [json.loads(line) for line in f if line.strip()]
                row = seed_row(seed, summary, rows, config.eval_episodes, minutes)
                curves[name].append((seed, *llm_gym_rewards(rows)))
            else:
                theirs = run_trl(config, f"{config.out}/{name}", own_defaults=name != "trl")
                held = {
                    "before": {"success": theirs["before"]},
                    "after": {"success": theirs["after"]},
                }
                row = seed_row(seed, held, [], config.eval_episodes, theirs["minutes"])
                curves[name].append((seed, theirs["steps"], theirs["rewards"]))
            results[name].append(row)
            print(json.dumps({name: row}), flush=True)
    for name, rows in results.items():
        print(f"{name}, dtype {args.dtype}:\n{seed_table(rows)}")
    if len(trainers) > 1:
        title = plot_title(config).replace(f", seed {config.seed}", f", seeds {args.seeds}")
        print(f"plot: {plot_seeds(args.plot, title, curves)}")
    return results


def main() -> None:
    args = parse_args()
    transformers.utils.logging.disable_progress_bar()
    out = args.out or tempfile.mkdtemp(prefix="bench_learning_")
    if args.seeds is not None:
        run_seeds(args, out)
        return
    config = run_config(args, out)
    env_args = config.env_args
    start = time.perf_counter()
    summary = GRPOTrainer(config).train()
    minutes = (time.perf_counter() - start) / 60
    before, after = summary["before"]["success"], summary["after"]["success"]
    gain = 100 * (after - before)
    met = gain >= args.target_points and after >= args.target_success
    met = met and minutes <= args.budget_minutes
    device = torch.cuda.get_device_name() if summary["device"].startswith("cuda") else "CPU"
    print(json.dumps({"env_args": env_args, "device": device}))
    print("| before | after | gain (points) | minutes | iterations x responses | target met |")
    print("|--------|-------|---------------|---------|------------------------|------------|")
    print(
        f"| {before:.3f} | {after:.3f} | {gain:+.1f} | {minutes:.1f} | "
        f"{args.iterations} x {args.groups * args.group_size} | {'yes' if met else 'no'} |"
    )
    print(f"curves: {out}/metrics.jsonl, {out}/training.png")
    if not args.vs_trl:
        return
    theirs = run_trl(config, out)
    with open(Path(out) / "metrics.jsonl") as f:
        steps, rewards = llm_gym_rewards([json.loads(line) for line in f if line.strip()])
    trl_label = success_label("trl", theirs["before"], theirs["after"])
    curves = {
        "llm_gym": (steps, rewards, success_label("llm_gym", before, after)),
        "trl": (theirs["steps"], theirs["rewards"], trl_label),
    }
    print(f"plot: {plot_comparison(args.plot, plot_title(config), curves)}")
    episodes = config.eval_episodes
    print(summary_line("llm_gym", before, after, episodes, minutes))
    print(summary_line("trl", theirs["before"], theirs["after"], episodes, theirs["minutes"]))


if __name__ == "__main__":
    main()
