"""What the benchmark scripts share: TorchRL on demand, the device they ran on, CUDA timing,
interleaved rounds of timed calls, the table of medians and ratios, and cProfile parts.

CUDA calls return before the GPU is done, so every timed call is bracketed by
``synchronize``; every script prints ``describe(device, dtype)`` so that a ratio is never
read without the machine it came from.
"""

from __future__ import annotations

import cProfile
import importlib
import os
import pstats
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

__all__ = [
    "Timed",
    "describe",
    "ensure_torchrl",
    "interleaved",
    "max_diff",
    "paired_ratio",
    "profile",
    "report",
    "synchronize",
]

Times = dict[str, list[tuple[float, float]]]  # per method: (wall s, cpu s) per round


def ensure_torchrl(install: bool) -> str | None:
    """Import torchrl (installing it if allowed); its version, or None if unavailable."""
    try:
        return importlib.import_module("torchrl").__version__
    except ImportError:
        if not install:
            return None
    torch_pin = f"torch=={torch.__version__.split('+')[0]}"
    print(f"installing torchrl: pip install torchrl tensordict {torch_pin}", flush=True)
    command = [sys.executable, "-m", "pip", "install", "-q", "torchrl", "tensordict", torch_pin]
    if subprocess.run(command).returncode != 0:
        return None
    importlib.invalidate_caches()
    try:
        return importlib.import_module("torchrl").__version__
    except ImportError:
        return None


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait for the GPU's queued work (a no-op on CPU)."""
    if torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda"):
        torch.cuda.synchronize()


def describe(device: torch.device | str, dtype: torch.dtype) -> str:
    """The device in words: the GPU's name, or the CPU's thread count; and the dtype."""
    device = torch.device(device)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = f"{torch.get_num_threads()} torch threads of {os.cpu_count()} cores"
    return (
        f"device {device} ({name}), {str(dtype).removeprefix('torch.')}, torch {torch.__version__}"
    )


class Timed:
    """``run()`` -> (wall seconds, process CPU seconds, output) of one timed call; ``prepare``
    (untimed) makes the call's argument."""

    def __init__(self, call: Callable[..., Any], prepare: Callable[[], Any] | None = None):
        self.call, self.prepare = call, prepare

    def run(self) -> tuple[float, float, Any]:
        """Time one call (CUDA synchronised around it)."""
        arg = self.prepare() if self.prepare is not None else None  # not timed
        synchronize()  # CUDA calls return before the GPU is done
        wall, cpu = time.perf_counter(), time.process_time()
        out = self.call() if self.prepare is None else self.call(arg)
        synchronize()
        return time.perf_counter() - wall, time.process_time() - cpu, out


def max_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    """The largest absolute difference between two lists of arrays (inf if shapes differ)."""
    if any(x.shape != y.shape for x, y in zip(a, b, strict=True)):
        return float("inf")
    return max(float(np.max(np.abs(x - y), initial=0.0)) for x, y in zip(a, b, strict=True))


def interleaved(methods: Mapping[str, Timed], rounds: int) -> Times:
    """Each round runs every method once, in an order rotated every round."""
    names = list(methods)
    times: Times = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            wall, cpu, _ = methods[name].run()
            times[name].append((wall, cpu))
        summary = "  ".join(
            f"{n} {times[n][-1][0] * 1e3:.0f}/{times[n][-1][1] * 1e3:.0f}" for n in names
        )
        print(f"  round {r + 1}/{rounds} (wall/cpu ms): {summary}", flush=True)
    return times


def paired_ratio(times: Times, num: str, den: str, clock: int) -> float:
    """The median of the per-round ratios num/den (clock 0: wall, 1: cpu)."""
    pairs = zip(times[num], times[den], strict=True)
    return statistics.median(a[clock] / b[clock] for a, b in pairs)


def report(
    times: Times,
    rounds: int,
    labels: Mapping[str, str],
    ratios: Mapping[str, tuple[str, str, str, bool]],
    targets: Mapping[str, tuple[str, float]],
) -> dict[str, float]:
    """Print the medians of every method in ``labels`` and every ratio (``key: (numerator,
    denominator, label, is a speed-up)``) against its target; the wall-clock ratios."""
    print(f"\n  median of {rounds} rounds        {'wall ms':>10} {'cpu ms':>10} {'min wall':>10}")
    for key, label in labels.items():
        if key in times:
            walls, cpus = [t[0] for t in times[key]], [t[1] for t in times[key]]
            print(
                f"  {key:2} {label:50} {statistics.median(walls) * 1e3:10.1f} "
                f"{statistics.median(cpus) * 1e3:10.1f} {min(walls) * 1e3:10.1f}"
            )
    print(f"\n  {'ratio (median of per-round ratios)':58} {'wall':>7} {'cpu':>7} {'target':>8} met")
    out = {}
    for key, (num, den, label, speedup) in ratios.items():
        if num not in times or den not in times:
            continue
        wall, cpu = paired_ratio(times, num, den, 0), paired_ratio(times, num, den, 1)
        out[key] = wall
        op, target = targets[key]
        met = "yes" if (wall <= target if op == "<=" else wall >= target) else "NO"
        unit = "x" if speedup else " "
        print(
            f"  {key:4} {label:53} {wall:6.3f}{unit} {cpu:6.3f}{unit} {op}{target:5.2f}{unit} {met}"
        )
    return out


def _profile_once(call: Callable[[], Any], parts: list[tuple[str, str, str]]) -> dict:
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    call()
    profiler.disable()
    total = time.perf_counter() - start
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    shares: dict[str, float] = {}
    for suffix, func, label in parts:
        shares[label] = sum(
            value[3]  # cumulative time
            for (filename, _, name), value in stats.items()
            if name == func and filename.endswith(suffix)
        )
    shares["everything else (python glue, numpy copies, outputs)"] = total - sum(shares.values())
    shares["total (under cProfile)"] = total
    return shares


def profile(
    call: Callable[[], Any], parts: list[tuple[str, str, str]], per: str, reps: int, what: str
) -> None:
    """Where ``call``'s time goes: the cumulative time of each ``(file suffix, function,
    label)`` part, read inside each of ``reps`` profiled calls (so their shares do not depend
    on how busy the machine was between calls), also per the part labelled ``per``."""
    runs = [_profile_once(call, parts) for _ in range(reps)]
    print(f"\n  profile of {what} ({reps} cProfile'd steps):")
    print(f"    {'part (medians)':56} {'ms':>10} {'of step':>8} {'/forward':>9}")
    for label in runs[0]:
        ms = statistics.median(r[label] for r in runs) * 1e3
        share = statistics.median(r[label] / r["total (under cProfile)"] for r in runs)
        # The part a step is measured per can be absent from a path (on CUDA the forward
        # runs elsewhere than on the CPU): then there is no ratio to it, not a division by 0.
        ratios = [r[label] / r[per] for r in runs if r[per] > 0]
        per_part = f"{statistics.median(ratios):9.3f}" if ratios else f"{'n/a':>9}"
        print(f"    {label:56} {ms:10.1f} {share:8.1%} {per_part}")
