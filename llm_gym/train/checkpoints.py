"""A training run's checkpoints: ``checkpoint-<iteration>/`` folders that ``--model PATH``,
``transformers`` and vLLM load as they are (safetensors weights, config, tokenizer), with the
trainer's state beside the weights; a LoRA run's hold its adapter (peft's files, which
``--model PATH`` loads onto their base and merges).

AdamW's state sits in ``optimizer/``, written with ``torch.distributed.checkpoint`` (each
process its own shards of a sharded run), which a run of any number of processes loads back.
With several processes every one calls ``save_checkpoint``; the first writes all but the
optimizer's shards (the weights gathered whole, as one process writes them) and renames.

A checkpoint is written aside (``checkpoint-<iteration>.partial/``), flushed to disk and
renamed into place, and only then are the oldest beyond ``keep`` deleted: a crash or Ctrl-C at
any moment of a save leaves the previous checkpoint whole, and a folder named
``checkpoint-<iteration>`` is always complete. A save the disk cannot take (full, read-only,
the folder gone) removes its ``.partial`` folder and raises a one-line ``RunWriteError``.
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

from llm_gym.lm.lora import ADAPTER_CONFIG, is_lora
from llm_gym.run.files import Recorder, write_failure
from llm_gym.run.setup import DTYPES
from llm_gym.run.signals import deferred, hold_signals, interruption
from llm_gym.train.config import GRPOConfig
from llm_gym.train.sharding import (
    barrier,
    full_weights,
    is_sharded,
    load_optimizer,
    note,
    process_rank,
    save_optimizer,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = [
    "OPTIMIZER_FOLDER",
    "RNG_STATE",
    "Checkpointer",
    "TRAINER_STATE",
    "checkpoint_folders",
    "latest_checkpoint",
    "load_checkpoint",
    "saved_folders",
    "save_checkpoint",
]

TRAINER_STATE = "trainer_state.json"  # iteration, evaluation, curriculum, stream, KL coef
RNG_STATE = "rng_state.pt"  # the torch and CUDA RNG states (the save's ``tensors``)
OPTIMIZER_FOLDER = "optimizer"  # in a checkpoint a run resumes from exactly: AdamW's, by DCP
_NAME = re.compile(r"checkpoint-(\d+)")
_OURS = (TRAINER_STATE, RNG_STATE)  # files no one but a save writes
_ASIDE = re.compile(r"checkpoint-\d+\.(partial|deleting)")  # a save's or a deletion's, unfinished


class Checkpointer:
    """The checkpoints of the run ``config`` describes, of ``model`` and its ``optimizer``:
    ``save`` writes one after an iteration, ``restore`` puts the optimizer and the RNG back
    from one. Every process of a sharded run calls both."""

    def __init__(
        self,
        config: GRPOConfig,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        optimizer: torch.optim.Optimizer,
    ) -> None:
        self.config, self.model, self.tokenizer = config, model, tokenizer
        self.optimizer = optimizer

    def save(self, iteration: int, state: dict[str, Any]) -> Path:
        """``checkpoint-<iteration>`` with the trainer's ``state`` (JSON) and the RNG states:
        all that ``--resume`` needs to go on as if the run had not stopped. The optimizer's
        state (twice the weights, in AdamW) goes in where a run may resume exactly: every
        checkpoint but the run's last by default; one without it holds the weights alone, in
        ``--save-dtype``."""
        config = self.config
        keep_optimizer = config.save_optimizer
        if keep_optimizer is None:
            keep_optimizer = iteration < config.iterations
        dtype = None
        if not keep_optimizer and config.save_dtype is not None:
            dtype = DTYPES[config.save_dtype]  # storage, not compute: no speed to warn of
        tensors = {
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        }
        return save_checkpoint(
            config.out, iteration, self.model, self.tokenizer, state, tensors,
            config.keep_checkpoints, dtype, optimizer=self.optimizer if keep_optimizer else None,
        )  # fmt: skip

    def restore(self, checkpoint: Path, tensors: dict[str, Any]) -> None:
        """The optimizer's state from ``checkpoint`` (resharded for this run's processes) and
        the RNG states of its ``tensors``."""
        if (checkpoint / OPTIMIZER_FOLDER).is_dir():
            load_optimizer(self.model, self.optimizer, checkpoint / OPTIMIZER_FOLDER)
        else:  # the run's last checkpoint, saved without it (--save-optimizer keeps it)
            note(
                f"{checkpoint} holds no optimizer state (a finished run's last checkpoint): "
                "AdamW starts afresh from its weights"
            )
        torch.set_rng_state(tensors["torch_rng"])
        if tensors["cuda_rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(tensors["cuda_rng"])


def checkpoint_folders(out: str | Path) -> list[Path]:
    """The complete checkpoints in the run folder ``out``, oldest first."""
    found = [
        (int(match.group(1)), path)
        for path in Path(out).glob("checkpoint-*")
        if (match := _NAME.fullmatch(path.name)) and path.is_dir()
    ]
    return [path for _, path in sorted(found)]


def latest_checkpoint(out: str | Path) -> Path | None:
    """The newest complete checkpoint in ``out`` (None: there is none)."""
    found = checkpoint_folders(out)
    return found[-1] if found else None


def saved_folders(out: str | Path) -> list[Path]:
    """What saves wrote into ``out``, for a new run to delete: ``checkpoint-<N>`` folders
    holding the trainer's files, and the ``.partial``/``.deleting`` folders of unfinished
    saves; never a folder of the user's (``checkpoint-backup/``, a ``checkpoint-3/`` of
    notes)."""
    out = Path(out)
    ours = [p for p in checkpoint_folders(out) if any((p / n).exists() for n in _OURS)]
    return ours + sorted(p for p in out.glob("checkpoint-*") if _ASIDE.fullmatch(p.name))


def save_checkpoint(
    out: str | Path,
    iteration: int,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    state: dict[str, Any],
    tensors: dict[str, Any],
    keep: int,
    dtype: torch.dtype | None = None,
    *,
    optimizer: torch.optim.Optimizer | None = None,
) -> Path:
    """Write ``checkpoint-<iteration>`` into ``out``: ``model`` and ``tokenizer`` as
    ``save_pretrained`` writes them (the weights in ``dtype``; None: the model's),
    ``optimizer``'s state in ``optimizer/`` (None: none), ``state`` (JSON) and ``tensors``
    (``torch.save``) beside; then delete all but the newest ``keep`` checkpoints. The
    checkpoint's folder. Every process of a sharded run calls it."""
    out, lead = Path(out), process_rank() == 0
    final, partial = out / f"checkpoint-{iteration}", out / f"checkpoint-{iteration}.partial"
    try:
        if lead:
            for path in [p for p in out.glob("checkpoint-*") if _ASIDE.fullmatch(p.name)]:
                shutil.rmtree(path, ignore_errors=True)  # of saves interrupted
            partial.mkdir()  # not parents=True: a run folder that vanished is not made again
        barrier()
        if optimizer is not None:
            save_optimizer(model, optimizer, partial / OPTIMIZER_FOLDER)
        weights = full_weights(model) if is_sharded(model) else None  # gathered on the first
        if lead:
            _write(partial, model, tokenizer, state, tensors, dtype, weights)
        barrier()  # every process's shards are written
        if lead:
            with deferred():  # a Ctrl-C waits for the rename
                if final.exists():  # this iteration's checkpoint of an earlier run in the folder
                    _discard(final)
                os.replace(partial, final)
    except BaseException as error:  # Ctrl-C and a dead process's collective too
        hold_signals()  # the run stops: a launcher's SIGTERM must not cut the cleanup short
        shutil.rmtree(partial, ignore_errors=True)  # no half-written checkpoint stays
        # torch.distributed.checkpoint catches a Ctrl-C and raises every rank's failures.
        failure = interruption(error) or write_failure(partial, error)
        if failure is None or failure is error:
            raise
        raise failure from error
    if lead:
        with deferred():  # and for the deletions
            _fsync(out)
            for old in [p for p in saved_folders(out) if _NAME.fullmatch(p.name)][:-keep]:
                _discard(old)
    barrier()
    return final


def _write(
    partial: Path,
    model: Any,
    tokenizer: Any,
    state: dict[str, Any],
    tensors: dict[str, Any],
    dtype: torch.dtype | None,
    weights: dict[str, torch.Tensor] | None,
) -> None:
    # weights: a sharded model's, gathered whole (None: the model's own).
    if dtype is None or dtype == model.dtype or is_lora(model):  # an adapter: small anyway
        model.save_pretrained(partial, state_dict=weights, safe_serialization=True)
    else:  # a cast copy of each tensor once, so that tied weights stay one tensor
        cast: dict[int, torch.Tensor] = {}
        whole = model.state_dict(keep_vars=True) if weights is None else weights
        weights = {
            name: cast.setdefault(id(tensor), tensor.detach().to(dtype))
            for name, tensor in whole.items()
        }
        model.save_pretrained(partial, state_dict=weights, safe_serialization=True)
    tokenizer.save_pretrained(partial)
    with open(partial / RNG_STATE, "wb") as f:
        recorder = Recorder(f)
        try:
            torch.save(tensors, recorder)
        except RuntimeError as error:  # torch's for a failed write: the OSError says why
            if recorder.error is None:
                raise
            raise recorder.error from error
    (partial / TRAINER_STATE).write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")
    for path in [*partial.iterdir(), *partial.glob(f"{OPTIMIZER_FOLDER}/*")]:
        _fsync(path)  # on disk before the rename makes the checkpoint count
    _fsync(partial)


def load_checkpoint(folder: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``state`` and ``tensors`` saved in the checkpoint ``folder``, after checking that
    every file is there and whole; a one-line error naming the first file that is not."""
    folder = Path(folder)
    weights = sorted(folder.glob("*.safetensors"))
    config = ADAPTER_CONFIG if (folder / ADAPTER_CONFIG).is_file() else "config.json"
    names = [config, TRAINER_STATE, RNG_STATE]
    for path in [folder / name for name in names] + (weights or [folder / "model.safetensors"]):
        if not path.is_file():
            raise FileNotFoundError(f"checkpoint file {path} is missing; {_older(folder)}")
    for path in weights:
        _check_safetensors(path, folder)
    dcp = folder / OPTIMIZER_FOLDER
    if dcp.exists() and not (dcp / ".metadata").is_file():  # DCP writes it last
        raise FileNotFoundError(f"checkpoint file {dcp / '.metadata'} is missing; {_older(folder)}")
    try:
        state = json.loads((folder / TRAINER_STATE).read_text(encoding="utf-8"))
    except ValueError as error:
        raise ValueError(
            f"checkpoint file {folder / TRAINER_STATE} is truncated or corrupt ({error}); "
            f"{_older(folder)}"
        ) from None
    _check_state(state, folder / TRAINER_STATE)
    try:
        tensors = torch.load(folder / RNG_STATE, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, ValueError) as error:
        message = str(error).splitlines()[0]
        raise ValueError(
            f"checkpoint file {folder / RNG_STATE} is truncated or corrupt ({message}); "
            f"{_older(folder)}"
        ) from None
    return state, tensors


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# What each field of trainer_state.json must hold (resume reads every one of them).
_STATE = {
    "iteration": ("an int >= 0", lambda v: _is_int(v) and v >= 0),
    "before": ("an object or null", lambda v: v is None or isinstance(v, dict)),
    "kl_coef": (
        "a number or null",
        lambda v: v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)),
    ),
    "level": ("an int or null", lambda v: v is None or _is_int(v)),
    "drawn_level": ("an int or null", lambda v: v is None or _is_int(v)),
    "successes": ("a list or null", lambda v: v is None or isinstance(v, list)),
    "positions": (
        "a list of ints or nulls",
        lambda v: isinstance(v, list) and all(p is None or _is_int(p) for p in v),
    ),
}


def _check_state(state: Any, path: Path) -> None:
    # A field of the wrong type would fail deep in the resume, without the file's name.
    if not isinstance(state, dict):
        raise ValueError(
            f"checkpoint file {path} must hold a JSON object, got {type(state).__name__}; "
            f"{_older(path.parent)}"
        )
    for name, (expected, valid) in _STATE.items():
        if name not in state:
            raise ValueError(
                f"checkpoint file {path} lacks the field {name!r}; {_older(path.parent)}"
            )
        if not valid(state[name]):
            raise ValueError(
                f"checkpoint file {path}: field {name!r} must be {expected}, got "
                f"{state[name]!r}; {_older(path.parent)}"
            )


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
