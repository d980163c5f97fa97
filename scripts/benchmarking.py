"""What the benchmark scripts share: TorchRL on demand, the device they ran on, CUDA timing.

CUDA calls return before the GPU is done, so every timed call is bracketed by
``synchronize``; every script prints ``describe(device, dtype)`` so that a ratio is never
read without the machine it came from.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import torch

__all__ = ["describe", "ensure_torchrl", "synchronize"]


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
