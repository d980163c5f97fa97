"""Does an agent learn through llm_gym? GRPO on a task, greedy success before and after.

Runs ``llm-gym train``'s job (``GRPOTrainer``) and prints the greedy success on held-out
questions before and after, the gain in points, the minutes it took, and whether it met the
target (``--target-points`` within ``--budget-minutes``). README's learning table is its
output. Defaults: the CPU demo (SmolLM2-135M-Instruct on reasoning-gym's ``chain_sum`` at
level 0, last-number answers).

    python scripts/bench_learning.py                                   # 2-core CPU demo
    python scripts/bench_learning.py --device cuda --groups 8 --iterations 70 \\
        --task basic_arithmetic --target-points 0 --target-success 0.6
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import torch
import transformers

from llm_gym.train import GRPOConfig, GRPOTrainer


def parse_args() -> argparse.Namespace:
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
    add("--target-points", type=float, default=15.0, help="gain in success, in points")
    add("--target-success", type=float, default=0.0, help="success after, at least")
    add("--budget-minutes", type=float, default=15.0)
    add("--out", default=None, help="run folder (default: a temporary one)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    transformers.utils.logging.disable_progress_bar()
    env_args = {"task": args.task, "level": args.level}
    out = args.out or tempfile.mkdtemp(prefix="bench_learning_")
    config = GRPOConfig(
        env="LLMChat-ReasoningGym-v0", env_args=env_args, answer_format=args.answer_format,
        model=args.model,
        iterations=args.iterations, groups=args.groups, group_size=args.group_size,
        learning_rate=args.learning_rate, max_new_tokens=args.max_new_tokens,
        eval_episodes=args.eval_episodes, kl_coef=args.kl_coef, device=args.device,
        dtype=args.dtype, seed=args.seed, out=out, overwrite=True, progress=False,
        save_every=args.iterations,
    )  # fmt: skip
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


if __name__ == "__main__":
    main()
