"""Which floating-point dtypes a device runs fast, and computing in a lower one than the
weights (autocast). A dtype below float32 halves the weights' memory everywhere, but it is
faster only where the hardware multiplies in it: every CUDA GPU in float16, those from Ampere
on in bfloat16; a CPU only with its bfloat16 or float16 matrix instructions (AVX-512 BF16, AMX).
Without them oneDNN falls back to plain loops: on an AVX2 CPU a bfloat16 vLLM server sampled at
0.31x HF generate's float32 tokens per second, a float32 one at 1.41x.

The environment variable ``LLM_GYM_CPU_BF16`` (``1`` or ``0``) overrides what the CPU is taken
to have, so that a machine can run everything as a CPU with (or without) bfloat16 instructions
would: ``--dtype auto`` then resolves as it would there (the test suite is run both ways).

>>> fast_dtype(torch.device("cpu")) in (torch.bfloat16, torch.float32)
True
>>> with autocast(torch.device("cpu"), torch.float32, torch.float32):  # no lower dtype: off
...     torch.is_autocast_enabled("cpu")
False
"""

from __future__ import annotations

import contextlib

import torch

from llm_gym.checks import CPU_BF16_VARIABLE, forced_cpu_bf16

__all__ = ["CPU_BF16_VARIABLE", "autocast", "cpu_has_bf16", "fast_dtype", "runs_fast"]

_LOW = (torch.bfloat16, torch.float16)


def cpu_has_bf16() -> bool:
    """Whether the CPU is taken to multiply in bfloat16 fast: ``LLM_GYM_CPU_BF16`` (``1`` or
    ``0``) where it is set, else whether it has AVX-512 BF16 or AMX."""
    forced = forced_cpu_bf16()
    if forced is not None:
        return forced
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def runs_fast(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether ``device`` multiplies matrices in ``dtype`` at least as fast as in float32."""
    if dtype not in _LOW:
        return True
    if device.type == "cuda":
        return dtype == torch.float16 or torch.cuda.is_bf16_supported(including_emulation=False)
    if device.type == "cpu":
        if dtype == torch.bfloat16:
            return cpu_has_bf16()
        return torch.cpu._is_amx_fp16_supported()
    return True  # an accelerator torch knows (MPS, XPU): its low precision is what it is for


def fast_dtype(device: torch.device) -> torch.dtype:
    """``--dtype auto``: bfloat16 where ``device`` runs it fast (its range is float32's, so
    nothing overflows), else float32."""
    return torch.bfloat16 if runs_fast(torch.bfloat16, device) else torch.float32


def autocast(
    device: torch.device, dtype: torch.dtype | None, weights: torch.dtype
) -> contextlib.AbstractContextManager[object]:
    """torch's autocast to ``dtype`` on ``device`` where ``dtype`` is below the ``weights``'
    dtype (matrix products in ``dtype``, reductions and softmax in float32: mixed precision);
    else nothing to do."""
    if dtype is None or dtype not in _LOW or dtype == weights:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)
