"""A training run's checkpoints: ``checkpoint-<iteration>/`` folders that ``--model PATH``,
``transformers`` and vLLM load as they are (safetensors weights, config, tokenizer), with the
trainer's state beside the weights.

A checkpoint is written aside (``checkpoint-<iteration>.partial/``), flushed to disk and
renamed into place, and only then are the oldest beyond ``keep`` deleted: a crash or Ctrl-C at
any moment of a save leaves the previous checkpoint whole, and a folder named
``checkpoint-<iteration>`` is always complete.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = [
    "OPTIMIZER_STATE",
    "TRAINER_STATE",
    "checkpoints",
    "latest_checkpoint",
    "load_checkpoint",
    "save_checkpoint",
]

TRAINER_STATE = "trainer_state.json"  # iteration, evaluation, curriculum, stream, KL coef
OPTIMIZER_STATE = "optimizer.pt"  # the optimizer's state and the RNG states (tensors)
_NAME = re.compile(r"checkpoint-(\d+)")


def checkpoints(out: str | Path) -> list[Path]:
    """The complete checkpoints in the run folder ``out``, oldest first."""
    found = [
        (int(match.group(1)), path)
        for path in Path(out).glob("checkpoint-*")
        if (match := _NAME.fullmatch(path.name)) and path.is_dir()
    ]
    return [path for _, path in sorted(found)]


def latest_checkpoint(out: str | Path) -> Path | None:
    """The newest complete checkpoint in ``out`` (None: there is none)."""
    found = checkpoints(out)
    return found[-1] if found else None


def save_checkpoint(
    out: str | Path,
    iteration: int,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    state: dict[str, Any],
    tensors: dict[str, Any],
    keep: int,
) -> Path:
    """Write ``checkpoint-<iteration>`` into ``out``: ``model`` and ``tokenizer`` as
    ``save_pretrained`` writes them, ``state`` (JSON) and ``tensors`` (``torch.save``) beside;
    then delete all but the newest ``keep`` checkpoints. The checkpoint's folder."""
    out = Path(out)
    final, partial = out / f"checkpoint-{iteration}", out / f"checkpoint-{iteration}.partial"
    for stale in [partial, *out.glob("checkpoint-*.deleting")]:  # of saves interrupted
        shutil.rmtree(stale, ignore_errors=True)
    model.save_pretrained(partial, safe_serialization=True)
    tokenizer.save_pretrained(partial)
    torch.save(tensors, partial / OPTIMIZER_STATE)
    (partial / TRAINER_STATE).write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")
    for path in partial.iterdir():  # on disk before the rename makes the checkpoint count
        _fsync(path)
    _fsync(partial)
    if final.exists():  # this iteration's checkpoint of an earlier run in the folder
        _discard(final)
    os.replace(partial, final)
    _fsync(out)
    for old in checkpoints(out)[:-keep]:
        _discard(old)
    return final


def load_checkpoint(folder: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``state`` and ``tensors`` saved in the checkpoint ``folder``, after checking that
    every file is there and whole; a one-line error naming the first file that is not."""
    folder = Path(folder)
    weights = sorted(folder.glob("*.safetensors"))
    names = ["config.json", TRAINER_STATE, OPTIMIZER_STATE]
    for path in [folder / name for name in names] + (weights or [folder / "model.safetensors"]):
        if not path.is_file():
            raise FileNotFoundError(f"checkpoint file {path} is missing; {_older(folder)}")
    for path in weights:
        _check_safetensors(path, folder)
    try:
        state = json.loads((folder / TRAINER_STATE).read_text(encoding="utf-8"))
    except ValueError as error:
        raise ValueError(
            f"checkpoint file {folder / TRAINER_STATE} is truncated or corrupt ({error}); "
            f"{_older(folder)}"
        ) from None
    try:
        tensors = torch.load(folder / OPTIMIZER_STATE, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, ValueError) as error:
        message = str(error).splitlines()[0]
        raise ValueError(
            f"checkpoint file {folder / OPTIMIZER_STATE} is truncated or corrupt ({message}); "
            f"{_older(folder)}"
        ) from None
    return state, tensors


def _check_safetensors(path: Path, folder: Path) -> None:
    # A safetensors file is an 8-byte header length, a JSON header giving each tensor's byte
    # range, then the data: the file must end where the last range does.
    size = path.stat().st_size
    try:
        with path.open("rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length)) if 8 + length <= size else None
        ends = [v["data_offsets"][1] for k, v in (header or {}).items() if k != "__metadata__"]
        complete = header is not None and 8 + length + max(ends, default=0) == size
    except (struct.error, ValueError, KeyError, TypeError):
        complete = False
    if not complete:
        raise ValueError(f"checkpoint file {path} is truncated or corrupt; {_older(folder)}")


def _older(folder: Path) -> str:
    return (
        f"delete {folder} to resume from the checkpoint before it, or start over with --overwrite"
    )


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _discard(path: Path) -> None:
    # Renamed first, so that a Ctrl-C during the deletion leaves no half-deleted folder
    # under a checkpoint's name.
    trash = path.with_name(path.name + ".deleting")
    shutil.rmtree(trash, ignore_errors=True)
    os.replace(path, trash)
    shutil.rmtree(trash)
