"""Peak resident memory of one training iteration of the default model on TextArena's
GuessTheNumber (the docs' game), against the model's own size measured in the same run: the
resident memory once the trainer is built (the model, its optimizer's first state not yet
made), then the peak while the iteration samples its episodes and while it updates, each over
the model's parameter bytes, in each ``--dtypes`` (``auto`` samples in bfloat16 on a CPU that
runs it fast). Each dtype runs in a process of its own (resident memory never shrinks back).

The target (issue 75): the whole iteration under 4 GB in both dtypes, as the trainer issue
brought it (from 7.1 GB).

    python scripts/bench_iteration_memory.py [--dtypes auto float32] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

GB = 1e9
TARGET_GB = 4.0


def resident() -> int:
    """This process's resident memory now, in bytes."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    import os

    return pages * os.sysconf("SC_PAGE_SIZE")


class Peak:
    """The highest resident memory seen, sampled every 20 ms on a thread, per phase."""

    def __init__(self) -> None:
        self.phase, self.peaks = "setup", {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.is_set():
            now = resident()
            self.peaks[self.phase] = max(self.peaks.get(self.phase, 0), now)
            time.sleep(0.02)

    def stop(self) -> dict[str, int]:
        self._stop.set()
        self._thread.join()
        return self.peaks


def one(dtype: str, threads: int, checkpointing: bool | None = None) -> dict[str, float]:
    """The measurement in this process: build the trainer, one iteration, phase by phase."""
    import torch

    from llm_gym.train import GRPOConfig, GRPOTrainer

    torch.set_num_threads(threads)
    peak = Peak()
    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            env="LLMChat-TextArena-v0", env_args={"game": "GuessTheNumber-v0"}, iterations=1,
            groups=2, group_size=8, max_new_tokens=12, eval_episodes=0, progress=False,
            dtype=dtype, out=out, gradient_checkpointing=checkpointing,
        )  # fmt: skip
        trainer = GRPOTrainer(config)
        built = resident()
        params = sum(p.numel() * p.element_size() for p in trainer.model.parameters())
        played, updated = trainer.feed.episodes, trainer.update

        def episodes(count: int) -> list:
            peak.phase = "sampling"
            return played(count)

        def update(*args: object, **kwargs: object) -> dict:
            peak.phase = "update"
            return updated(*args, **kwargs)

        trainer.feed.episodes, trainer.update = episodes, update
        trainer.iteration(0)
        peaks = peak.stop()
        trainer.close()
        trainer.lock.release()
    return {
        "dtype": dtype,
        "sampled_in": str(trainer.compute_dtype).removeprefix("torch."),
        "model_gb": params / GB,
        "built_gb": built / GB,
        **{f"{phase}_gb": value / GB for phase, value in peaks.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtypes", nargs="+", default=["auto", "float32"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--checkpointing",
        choices=["auto", "on", "off"],
        default="auto",
        help="activation checkpointing: the trainer's rule (auto) or forced",
    )
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child's dtype
    args = parser.parse_args(argv)
    if args.one is not None:
        forced = {"auto": None, "on": True, "off": False}[args.checkpointing]
        print(json.dumps(one(args.one, args.threads, forced)))
        return 0
    print("| dtype (samples in) | model (GB) | built (GB) | sampling peak (GB) | update peak (GB) "
          "| peak / model | under 4 GB |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for dtype in args.dtypes:
        done = subprocess.run(
            [sys.executable, str(Path(__file__)), "--one", dtype, "--threads", str(args.threads),
             "--checkpointing", args.checkpointing],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        row = json.loads(done.stdout.strip().splitlines()[-1])
        top = max(row.get("sampling_gb", 0.0), row.get("update_gb", 0.0), row["built_gb"])
        print(f"| {row['dtype']} ({row['sampled_in']}) | {row['model_gb']:.2f} "
              f"| {row['built_gb']:.2f} | {row.get('sampling_gb', 0.0):.2f} "
              f"| {row.get('update_gb', 0.0):.2f} | {top / row['model_gb']:.1f} "
              f"| {'yes' if top < TARGET_GB else 'NO'} |", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
