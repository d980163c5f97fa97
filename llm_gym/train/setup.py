"""Device and dtype by name, and a task's vector env as a token-in/token-out policy needs it."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import torch

__all__ = ["DTYPES", "make_task_envs", "resolve_device", "resolve_dtype"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``"auto"`` or None: CUDA when there is a GPU, else the CPU; else the named device,
    which must exist here."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as error:
        expected = "'auto', 'cpu', 'cuda' or 'cuda:N'"
        raise ValueError(f"device must be {expected}, got {device!r}") from error
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} needs a GPU, and torch sees none here")
    return resolved


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """A torch dtype from its name (``"float32"``, ``"bfloat16"``, ``"float16"``)."""
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]


def make_task_envs(
    env_id: str,
    num_envs: int,
    tokenizer: Any,
    env_args: dict[str, Any] | None = None,
    **options: Any,
) -> gym.vector.VectorEnv:
    """``gym.make_vec(env_id)`` in tokens mode for ``tokenizer`` (with the history kept for
    the records), the native vector env when the id has one; ``options`` that are None are
    left to the env's defaults."""
    kwargs: dict[str, Any] = {
        **(env_args or {}),
        **{key: value for key, value in options.items() if value is not None},
        "input_mode": "tokens",
        "tokenizer": tokenizer,
        "observation_keys": ("tokens", "history"),
    }
    spec = gym.spec(env_id)
    mode = "vector_entry_point" if spec.vector_entry_point is not None else "sync"
    return gym.make_vec(env_id, num_envs=num_envs, vectorization_mode=mode, **kwargs)
