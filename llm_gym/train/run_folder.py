"""What a training run keeps in its folder, and who may use the folder: a new run, a resumed
one (``--resume``) or one that replaces it (``--overwrite``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from llm_gym.run.describe import run_rows, run_title
from llm_gym.run.plots import plot_training
from llm_gym.run.report import write_report
from llm_gym.train.checkpoints import latest_checkpoint
from llm_gym.train.config import CONFIG_FILE, GRPOConfig, check_resumable

__all__ = [
    "METRICS_FILE",
    "TRAINING_PLOT_FILE",
    "SERVED_FOLDER",
    "SUMMARY_FILE",
    "claim_out",
    "clear_out",
    "earlier_rows",
    "write_summary",
]

# What a run leaves in its folder (the files --resume reads among them).
METRICS_FILE = "metrics.jsonl"  # a line per iteration, flushed as it ends
TRAINING_PLOT_FILE = "training.png"
SUMMARY_FILE = "summary.json"
SERVED_FOLDER = "served-model"  # --backend vllm: the weights the server samples with


def claim_out(config: GRPOConfig) -> Path | None:
    """The newest checkpoint to resume from (``config.resume``, checked against the saved
    run config), else None once ``config.out`` is free for a new run (empty, or
    ``config.overwrite``); two runs never mix in one folder."""
    out = Path(config.out)
    if config.resume:
        check_resumable(config)
        checkpoint = latest_checkpoint(out)
        if checkpoint is None:
            raise FileNotFoundError(
                f"--resume needs a checkpoint of the run in {out}, but there is no "
                f"{out}/checkpoint-<iteration>/ (one is written every --save-every iterations)"
            )
        return checkpoint
    if ((out / METRICS_FILE).exists() or (out / CONFIG_FILE).exists()) and not config.overwrite:
        raise FileExistsError(
            f"{out} holds an earlier run; pass --resume to continue it, --overwrite to start "
            "over, or another --out"
        )
    return None


def clear_out(out: Path) -> None:
    """``--overwrite``: the earlier run's files and checkpoints go."""
    for name in (METRICS_FILE, TRAINING_PLOT_FILE, SUMMARY_FILE, CONFIG_FILE):
        (out / name).unlink(missing_ok=True)
    for path in out.glob("checkpoint-*"):
        shutil.rmtree(path)
    out.mkdir(parents=True, exist_ok=True)


def earlier_rows(out: Path, start: int) -> list[dict[str, Any]]:
    """The metrics rows of the iterations before ``start`` (a resumed run keeps those its
    checkpoint holds; later ones, and a line cut short by Ctrl-C, are done again)."""
    path, rows = out / METRICS_FILE, []
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            break
        if row["iteration"] < start:
            rows.append(row)
    return rows


def write_summary(out: Path, summary: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """Write a run's ``summary.json`` (``summary``: ``describe_run``'s fields, ``before`` and
    ``after`` evaluations, ``interrupted``), its plot of the metrics ``rows`` and
    ``report.md``."""
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    before, after = summary["before"], summary["after"]
    title = run_title(summary) + (" (interrupted)" if summary["interrupted"] else "")
    plot_training(rows, before, after, out / TRAINING_PLOT_FILE, title)
    numbers = [("iterations", len(rows))]
    for name, evaluation in (("before", before), ("after", after)):
        if evaluation is not None:
            numbers.append((f"greedy success {name}", evaluation["success"]))
    if rows:
        numbers.append(("sampled success, last iteration", rows[-1]["success"]))
    rows_ = [*run_rows(summary), *numbers]
    write_report(out, f"Training: {title}", rows_, [out / TRAINING_PLOT_FILE])
