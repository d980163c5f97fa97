"""Which floating-point dtypes a device runs fast, and computing in a lower one than the
weights (autocast). A dtype below float32 halves the weights' memory everywhere, but it is
faster only where the hardware multiplies in it: every CUDA GPU in float16, those from Ampere
on in bfloat16; a CPU only with its bfloat16 or float16 matrix instructions (AVX-512 BF16, AMX).
Without them oneDNN falls back to plain loops: on an AVX2 CPU a bfloat16 vLLM server sampled at
0.31x HF generate's float32 tokens per second, a float32 one at 1.41x.

>>> fast_dtype(torch.device("cpu")) in (torch.bfloat16, torch.float32)
True
>>> with autocast(torch.device("cpu"), torch.float32, torch.float32):  # no lower dtype: off
...     torch.is_autocast_enabled("cpu")
False
"""

from __future__ import annotations

import contextlib

import torch

__all__ = ["autocast", "fast_dtype", "runs_fast"]

_LOW = (torch.bfloat16, torch.float16)


def runs_fast(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether ``device`` multiplies matrices in ``dtype`` at least as fast as in float32."""
    if dtype not in _LOW:
        return True
    if device.type == "cuda":
        return dtype == torch.float16 or torch.cuda.is_bf16_supported(including_emulation=False)
    if device.type == "cpu":
        cpu = torch.cpu
        if dtype == torch.bfloat16:
            return cpu._is_avx512_bf16_supported() or cpu._is_amx_tile_supported()
        return cpu._is_amx_fp16_supported()
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
