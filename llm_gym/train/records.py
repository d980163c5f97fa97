"""What a training run leaves in its folder: metrics, their plot, and checkpoints.

- ``metrics.jsonl``: one line per iteration, written and flushed as it ends, so an
  interrupted run keeps every finished iteration.
- ``training.png``: the curves of those metrics.
- ``checkpoint/``: the model and tokenizer (``save_pretrained``) and ``trainer.pt`` (the
  optimizer, the iteration it was saved after, the KL coefficient, the level and the RNG
  states), replaced as a whole so that a crash mid-save leaves the previous one.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "CHECKPOINT_DIR",
    "METRICS_FILE",
    "PLOTTED",
    "PLOT_FILE",
    "load_trainer_state",
    "read_metrics",
    "save_checkpoint",
]

METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "training.png"
CHECKPOINT_DIR = "checkpoint"
TRAINER_STATE = "trainer.pt"
PLOTTED = ("reward", "success", "kl", "response_tokens", "level", "tokens_per_second")


def read_metrics(path: Path, before: int | None = None) -> list[dict[str, Any]]:
    """The metrics lines of ``path`` (those of iterations ``< before`` when given)."""
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    return [r for r in rows if before is None or r["iteration"] < before]


def save_checkpoint(out: Path, model: Any, tokenizer: Any, state: dict[str, Any]) -> Path:
    """Write ``out/checkpoint`` (model, tokenizer, ``trainer.pt`` with ``state``)."""
    final = out / CHECKPOINT_DIR
    partial = out / (CHECKPOINT_DIR + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    torch.save(state, partial / TRAINER_STATE)
    shutil.rmtree(final, ignore_errors=True)
    partial.rename(final)
    return final


def load_trainer_state(out: Path) -> dict[str, Any]:
    """``trainer.pt`` of ``out/checkpoint``; a clear error when there is none."""
    path = out / CHECKPOINT_DIR / TRAINER_STATE
    if not path.is_file():
        raise FileNotFoundError(
            f"--resume needs a checkpoint of an earlier run in {out}, but {path} does not "
            "exist (checkpoints are written every --save-every iterations)"
        )
    return torch.load(path, map_location="cpu", weights_only=False)
