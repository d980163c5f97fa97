"""Sizes checked before a run allocates anything: how many sequences one batch holds
(``--num-envs``; ``--groups`` × ``--group-size``; ``--minibatch-size``), how long they grow
(``--max-new-tokens``) and how many records a run keeps (``--episodes``), against the memory
the machine has. The estimates are lower bounds read from the model's ``config.json`` and
weight headers (no weights load): a run refused here could not have fit, and the error names
the flag, the value given and the most that fits.

>>> per_sequence({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
...               "vocab_size": 100}, tokens=10, dtype_bytes=4)
20880
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "MAX_ENVS",
    "RECORD_BYTES",
    "activation_bytes",
    "available_memory",
    "check_batch",
    "check_count",
    "model_shape",
    "per_sequence",
]

# Sub-envs (conversations) one run steps at once: each is an env object and, with --async, a
# thread; vLLM itself schedules at most a few hundred sequences at a time.
MAX_ENVS = 4096
RECORD_BYTES = 1024  # a finished episode's record kept in memory, at the very least


def check_count(name: str, flag: str, value: int, limit: int, what: str) -> int:
    """``value`` if at most ``limit``; else a one-line ``ValueError`` naming ``name`` (the
    field) and ``flag``.

    >>> check_count("num_envs", "--num-envs", 100000, MAX_ENVS, "sub-envs a run steps at once")
    Traceback (most recent call last):
    ...
    ValueError: num_envs=100000 (--num-envs) is more than the 4096 sub-envs a run steps at once
    """
    if value > limit:
        raise ValueError(f"{name}={value} ({flag}) is more than the {limit} {what}")
    return value


def _meminfo() -> dict[str, int]:
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
    except OSError:
        return {}
    info = {}
    for line in lines:
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            info[name] = int(parts[0]) * 1024
    return info


def _cgroup_room() -> int | None:
    # The container's memory limit less its use (cgroup v2, else v1); None: no limit.
    v1 = "/sys/fs/cgroup/memory/memory."
    for limit, usage in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (f"{v1}limit_in_bytes", f"{v1}usage_in_bytes"),
    ):
        try:
            cap, used = Path(limit).read_text().strip(), Path(usage).read_text().strip()
        except OSError:
            continue
        if cap.isdigit() and used.isdigit() and int(cap) < 1 << 60:
            return max(int(cap) - int(used), 0)
    return None


def available_memory(device: Any = "cpu") -> int | None:
    """Bytes a run may still allocate on ``device`` (a torch device or its name): a GPU's
    free memory; for the CPU, ``MemAvailable`` and free swap, within the container's limit.
    None when the machine does not say."""
    if str(device).startswith("cuda"):
        import torch

        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    info = _meminfo()
    if "MemAvailable" in info:
        free = info["MemAvailable"] + info.get("SwapFree", 0)
    else:
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError):
            return None
    room = _cgroup_room()
    return free if room is None else min(free, room)


def model_shape(folder: str | os.PathLike[str]) -> tuple[dict[str, Any], int] | None:
    """The model's config (the text model's, for a multimodal one) and its parameter count,
    read from ``config.json`` and the safetensors headers in ``folder``; None when they are
    not there (nothing is checked then)."""
    folder = Path(folder)
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    config = config.get("text_config") or config
    params = 0
    for path in folder.glob("*.safetensors"):
        try:
            with path.open("rb") as f:
                (length,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(length))
            params += sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__")
        except (OSError, ValueError, KeyError, TypeError, struct.error):
            return None
    return config, params


def _dims(config: Mapping[str, Any]) -> tuple[int, int, int, int, int, int] | None:
    # hidden, layers, kv heads, head dim, intermediate, vocab, from llama- or gpt2-style keys.
    def get(*names: str) -> Any:
        return next((config[n] for n in names if isinstance(config.get(n), int)), None)

    hidden = get("hidden_size", "n_embd", "d_model")
    layers = get("num_hidden_layers", "n_layer", "num_layers")
    heads = get("num_attention_heads", "n_head")
    vocab = get("vocab_size")
    if None in (hidden, layers, heads, vocab) or not heads:
        return None
    kv_heads = get("num_key_value_heads") or heads
    head_dim = get("head_dim") or hidden // heads
    intermediate = get("intermediate_size", "n_inner") or 4 * hidden
    return hidden, layers, kv_heads, head_dim, intermediate, vocab


def activation_bytes(config: Mapping[str, Any], tokens: int, dtype_bytes: int) -> int | None:
    """Bytes a forward of ``tokens`` tokens keeps for its backward without activation
    checkpointing, the output layer aside: about 12 hidden-sized and 5 intermediate-sized
    values a token and layer (the norms' outputs, q, k, v, the attention's output, the
    residuals, the MLP's gate, up, their product; 1.8 MB a token for SmolLM2-135M in float32,
    as measured). None when ``config`` lacks the sizes.

    >>> activation_bytes({"hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9,
    ...                   "intermediate_size": 1536, "vocab_size": 49152}, 1, 4)
    1751040
    """
    dims = _dims(config)
    if dims is None:
        return None
    hidden, layers, _, _, intermediate, _ = dims
    return tokens * layers * (12 * hidden + 5 * intermediate) * dtype_bytes


def per_sequence(
    config: Mapping[str, Any], tokens: int, dtype_bytes: int, train: bool = False
) -> int | None:
    """Bytes one sequence of ``tokens`` tokens needs at least: generating (its KV cache, one
    layer's MLP activations, the last position's float32 logits) or, with ``train``, a
    forward kept for the backward (every layer's activations, every position's logits and
    log-probs). None when ``config`` lacks the sizes."""
    dims = _dims(config)
    if dims is None:
        return None
    hidden, layers, kv_heads, head_dim, intermediate, vocab = dims
    if train:
        logits = vocab * (dtype_bytes + 4)  # the logits, and their float32 log-probs
        per_token = layers * (4 * hidden + 2 * intermediate) * dtype_bytes + logits
        return tokens * per_token
    kv = tokens * layers * 2 * kv_heads * head_dim * dtype_bytes
    return kv + tokens * max(hidden, intermediate) * dtype_bytes + vocab * 4


def check_batch(
    flag: str, given: int, each: int | None, sizes: str, available: int | None,
    fixed: int = 0, what: str = "sequences",
) -> None:  # fmt: skip
    """A one-line ``ValueError`` naming ``flag`` when ``given`` items of ``each`` bytes (a
    lower bound; None: unknown, no check), with ``fixed`` bytes (the model's), need more than
    the ``available`` bytes; ``sizes`` says what sizes each."""
    if each is None or available is None:
        return
    need = fixed + given * each
    if need <= available:
        return
    fits = max((available - fixed) // each, 0)
    model = f", with the model {_size(fixed)}" if fixed else ""
    raise ValueError(
        f"{flag} {given}: {given} {what} {sizes} need at least {_size(need)} ({_size(each)} "
        f"each{model}), more than the {_size(available)} this machine has free; at most "
        f"{fits} fit"
    )


def _size(size: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size / 1e3:.1f} KB"


DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def check_run(
    config: Any,
    device: Any,
    batches: list[tuple[str, int, int, bool]],
    records: tuple[str, int] | None = None,
    copies: int = 1,
    train: bool = False,
    dtype: str = "float32",
    shards: tuple[int, int] = (1, 1),
) -> None:
    """Check a run of ``config`` (a ``RunConfig``) on ``device`` before it loads anything:
    each of ``batches`` — ``(flag, sequences, tokens, with_grad)`` — with the model's
    ``copies`` in ``dtype`` (weights; with ``train`` also gradients and AdamW's state) in the
    device's memory, and ``records`` — ``(flag, count)`` episodes kept — in the host's. A
    one-line ``ValueError`` naming the first flag that does not fit. ``shards``: (the
    processes the trained copy is sharded over, those of them on this machine), each
    holding its slice of that copy and, on the CPU, its share of the host's memory."""
    from llm_gym.lm.loading import model_folder

    shape = model_shape(model_folder(config.model))
    if shape is None:
        return
    model, params = shape
    dtype_bytes = DTYPE_BYTES[dtype]
    # Training adds the gradients and AdamW's two moments; below float32, float32 masters
    # and moments (llm_gym.train.optim.MasterAdamW): 12 bytes a parameter.
    optimizer = 2 * dtype_bytes if dtype_bytes >= 4 else 12
    world, local = shards
    trained = dtype_bytes * (1 + train) + (optimizer if train else 0)
    # Whole bytes: a float here would print "at most 47.0 fit"; ceil keeps the lower bound.
    fixed = params * dtype_bytes * (copies - 1) + -(-params * trained // world)
    free = available_memory(device)
    if free is not None and not str(device).startswith("cuda"):
        free //= local  # the processes on this machine share its memory
    for flag, sequences, tokens, grad in batches:
        each = per_sequence(model, tokens, dtype_bytes, train=grad)
        sizes = f"of at least {tokens} tokens (--max-new-tokens {config.max_new_tokens})"
        check_batch(flag, sequences, each, sizes, free, fixed)
    if records is not None:
        host = available_memory("cpu")
        if host is not None and not str(device).startswith("cuda"):
            host -= fixed
        flag, count = records
        check_batch(flag, count, RECORD_BYTES, "kept as records", host, what="episodes")
