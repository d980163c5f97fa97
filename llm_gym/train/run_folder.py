"""What a training run keeps in its folder, and who may use the folder: a new run, a resumed
one (``--resume``) or one that replaces it (``--overwrite``); the run's config saved there,
loaded again, and what a resume may change in it."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from llm_gym.episodes import ARRAYS
from llm_gym.options import flags
from llm_gym.run.describe import describe_run, run_rows, run_title
from llm_gym.run.files import EPISODES_FILE, LineFile, RunWriteError, write_text
from llm_gym.run.plots import plot_training
from llm_gym.run.report import REPORT_FILE, write_report
from llm_gym.run.signals import Interrupted
from llm_gym.run.trackers import clear_trackers, report_to
from llm_gym.train.checkpoints import latest_checkpoint, saved_folders
from llm_gym.train.config import RESUMABLE, GRPOConfig

__all__ = [
    "CONFIG_FILE",
    "EpisodeLog",
    "METRICS_FILE",
    "TRAINING_PLOT_FILE",
    "SERVED_FOLDER",
    "SUMMARY_FILE",
    "budget_spent",
    "check_resumable",
    "check_iterations_left",
    "claim_out",
    "clear_out",
    "earlier_rows",
    "load_config",
    "metrics_file",
    "resumable_flags",
    "resume_conflicts",
    "resume_hint",
    "resumed_config",
    "save_config",
    "start_over",
    "stop_notes",
    "training_summary",
    "write_summary",
]

# What a run leaves in its folder (the files --resume reads among them).
CONFIG_FILE = "run_config.json"  # the run's GRPOConfig, written when the run starts
METRICS_FILE = "metrics.jsonl"  # a line per iteration, written as it ends
TRAINING_PLOT_FILE = "training.png"
SUMMARY_FILE = "summary.json"
SERVED_FOLDER = "served-model"  # --backend vllm: the weights the server samples with


def save_config(config: GRPOConfig) -> Path:
    """Write ``config`` as JSON into its run folder ``config.out``; the file's path."""
    text = json.dumps(dataclasses.asdict(config), indent=2) + "\n"
    return write_text(Path(config.out) / CONFIG_FILE, text)


def load_config(out: str | Path) -> GRPOConfig:
    """The ``GRPOConfig`` a run saved in its folder ``out``; a one-line error naming the file
    when it is missing or broken. Its trackers are not asked to be installed here (a run
    loads on a machine that lacks one): a resume that reports to them asks."""
    path = Path(out) / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"--resume needs an earlier run in {out}, but its run config {path} does not "
            "exist (train once without --resume first)"
        )
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
        names = {f.name for f in dataclasses.fields(GRPOConfig)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ValueError(f"unknown fields {unknown}")
        trackers = values.pop("report_to", [])
        config = GRPOConfig(**values)
        config.report_to = report_to(",".join(trackers) or "none")  # the names, checked
        return config
    except (ValueError, TypeError) as error:  # JSONDecodeError is a ValueError
        message = " ".join(str(error).split())
        raise ValueError(
            f"the run config {path} is truncated or not a GRPOConfig: {message}"
        ) from None


def resumable_flags() -> str:
    """The flags a resumed run may change (``RESUMABLE``'s), for its messages."""
    named = flags(GRPOConfig)
    return ", ".join(named[n] for n in RESUMABLE if n not in ("out", "resume", "overwrite"))


def resume_conflicts(saved: GRPOConfig, config: GRPOConfig) -> list[str]:
    """The fields outside ``RESUMABLE`` in which ``config`` differs from the ``saved`` run's."""
    return [
        f.name
        for f in dataclasses.fields(GRPOConfig)
        if f.name not in RESUMABLE and getattr(saved, f.name) != getattr(config, f.name)
    ]


def check_resumable(config: GRPOConfig) -> GRPOConfig:
    """The saved config of the run ``config`` resumes (in ``config.out``); a one-line error
    naming the first field outside ``RESUMABLE`` that differs from it."""
    saved = load_config(config.out)
    for name in resume_conflicts(saved, config):
        raise ValueError(
            f"{name}={getattr(config, name)!r} differs from the resumed run's "
            f"{name}={getattr(saved, name)!r} ({Path(config.out) / CONFIG_FILE}); a resumed "
            f"run may change only {resumable_flags()}"
        )
    return saved


def resumed_config(out: str | Path, **changes: object) -> GRPOConfig:
    """The config of the run saved in ``out``, set to resume, with ``changes`` (options a
    resume may change only: ``RESUMABLE``; others must equal the saved values)."""
    changes.update(out=str(out), resume=True, overwrite=False)
    config = dataclasses.replace(load_config(out), **changes)
    check_resumable(config)
    return config


def check_iterations_left(config: GRPOConfig, done: int) -> None:
    """That a resumed run whose checkpoint has ``done`` iterations has some left, and tokens
    left under ``--max-sampled-tokens``."""
    if done >= config.iterations:
        raise ValueError(
            f"the run in {config.out} has done {done} iterations; pass --iterations above "
            f"{done} to train on"
        )
    rows = earlier_rows(Path(config.out), done) if config.max_sampled_tokens else []
    if budget_spent(rows, config.max_sampled_tokens):
        raise ValueError(
            f"the run in {config.out} has sampled {sampled_tokens(rows)} tokens in {done} "
            f"iterations; pass --max-sampled-tokens above {config.max_sampled_tokens} to "
            "train on"
        )


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
        _check_rows(out, checkpoint)
        return checkpoint
    if ((out / METRICS_FILE).exists() or (out / CONFIG_FILE).exists()) and not config.overwrite:
        raise FileExistsError(
            f"{out} holds an earlier run; pass --resume to continue it, --overwrite to start "
            "over, or another --out"
        )
    return None


def _check_rows(out: Path, checkpoint: Path) -> None:
    # The resumed run rewrites metrics.jsonl from the rows before its checkpoint: without the
    # file they would be lost for good, so refuse; a file short of rows is said in one line.
    done = int(checkpoint.name.rsplit("-", 1)[1])
    path = out / METRICS_FILE
    if not done:
        return
    if not path.is_file():
        raise FileNotFoundError(
            f"--resume: {path} is missing, and with it the rows of the iterations before "
            f"{checkpoint.name} (0 to {done - 1}); restore the file, or start over with "
            "--overwrite"
        )
    kept = {row["iteration"] for row in earlier_rows(out, done)}
    if len(kept) < done:
        print(
            f"llm-gym: {path} holds the rows of {len(kept)} of the {done} iterations "
            f"{checkpoint.name} holds; the resumed run's metrics and plot lack the others",
            file=sys.stderr,
        )


def clear_out(out: Path) -> None:
    """``--overwrite``: the earlier run's files and checkpoints go, and nothing else (a
    folder of the user's named ``checkpoint-backup`` stays)."""
    files = (METRICS_FILE, TRAINING_PLOT_FILE, SUMMARY_FILE, CONFIG_FILE, REPORT_FILE)
    for name in (*files, EPISODES_FILE):
        (out / name).unlink(missing_ok=True)
    clear_trackers(out)
    for path in saved_folders(out):
        shutil.rmtree(path)
    out.mkdir(parents=True, exist_ok=True)


def start_over(config: GRPOConfig) -> None:
    """A new run in ``config.out``, set up without error: the earlier run's files go
    (``clear_out``) and this one's config is saved, what ``--resume`` continues."""
    clear_out(Path(config.out))
    save_config(config)


def resume_hint(out: str | Path) -> str:
    """What a stopped training run left in ``out`` and how to go on: ``--resume`` from its
    newest checkpoint, or, with none yet, that there is nothing to resume."""
    out = Path(out)
    with contextlib.suppress(OSError, ValueError, AttributeError):  # none, or not a summary
        if json.loads((out / SUMMARY_FILE).read_text()).get("interrupted") is False:
            return f"the run had finished: {out / SUMMARY_FILE} holds what it came to"
    checkpoint, metrics = latest_checkpoint(out), out / METRICS_FILE
    finished = metrics.is_file() and metrics.stat().st_size > 0
    rows = f"finished iterations are in {metrics}" if finished else "no iteration finished"
    if checkpoint is not None:
        return f"{rows}; --resume continues from {checkpoint}"
    if finished or (out / CONFIG_FILE).exists():
        return (
            f"{rows} and no checkpoint was written yet (--save-every), so there is nothing "
            "to resume: start over with --overwrite"
        )
    return f"nothing was written to {out}: run the command again"


def metrics_file(out: Path, rows: list[dict[str, Any]], lead: bool) -> Any:
    """``out``'s ``metrics.jsonl`` opened for a line per iteration (a context manager whose
    ``write(line)`` appends one, readable after Ctrl-C), holding the earlier iterations'
    ``rows`` first, written aside so that a full disk cannot cost them; a process past the
    first (``lead`` False) writes nothing."""
    if not lead:
        return contextlib.nullcontext(_NOWHERE)
    write_text(out / METRICS_FILE, "".join(json.dumps(row) + "\n" for row in rows))
    return LineFile(out / METRICS_FILE)


class EpisodeLog:
    """``--log-episodes``: each iteration's episodes appended to ``out``'s ``episodes.jsonl``
    as ``llm-gym rollout`` writes them (``Episode.record`` less its token arrays), with their
    ``episode`` (the line's index) and ``iteration``; a branch's ``branch["of"]`` is its
    parent's line index in the file. A resumed run (from iteration ``start``) keeps the lines
    of the iterations before it, as the metrics' rows.
    """

    def __init__(self, out: Path, start: int, on: bool = True) -> None:
        self.path, self.on, kept = out / EPISODES_FILE, on, []
        if not on:  # off (no --log-episodes, a process past the first): writes nothing
            return
        lines = self.path.read_text(encoding="utf-8").splitlines() if self.path.exists() else []
        for line in lines:
            try:
                if json.loads(line)["iteration"] < start:
                    kept.append(line + "\n")
            except (ValueError, KeyError, TypeError):
                break  # a line cut short by Ctrl-C: the rest is done again
        write_text(self.path, "".join(kept))
        self.lines = len(kept)

    def write(self, iteration: int, episodes: list[Any]) -> None:
        """Append ``episodes`` (one iteration's batch, in order)."""
        if not self.on:
            return
        first = self.lines
        with LineFile(self.path) as f:
            for episode in episodes:
                record = {k: v for k, v in episode.record().items() if k not in ARRAYS}
                if record.get("branch") is not None:
                    record["branch"] = {**record["branch"], "of": first + record["branch"]["of"]}
                f.write(json.dumps({"episode": self.lines, "iteration": iteration, **record},
                                   ensure_ascii=False))  # fmt: skip
                self.lines += 1


# Where the processes past the first write their files: nowhere (the first writes them).
_NOWHERE = type("_Nowhere", (), {"write": staticmethod(lambda line: None)})()


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


def budget_spent(rows: list[dict[str, Any]], budget: int | None) -> bool:
    """Whether the metrics ``rows`` sampled ``budget`` tokens or more (``--max-sampled-tokens``;
    None: no budget). A row of a run from before rows counted them counts none.

    >>> budget_spent([{"sampled_tokens": 300}, {"sampled_tokens": 250}], 500)
    True
    >>> budget_spent([{"sampled_tokens": 300}, {}], 500), budget_spent([{}], None)
    (False, False)
    """
    return budget is not None and sampled_tokens(rows) >= budget


def sampled_tokens(rows: list[dict[str, Any]]) -> int:
    """The tokens the metrics ``rows`` sampled, all together."""
    return sum(row.get("sampled_tokens", 0) for row in rows)


def training_summary(
    config: GRPOConfig,
    rows: list[dict[str, Any]],
    *,
    before: dict[str, float] | None,
    after: dict[str, float] | None,
    seconds: float,
    interrupted: bool,
    answer_format: str | None,
    tasks: set[str],
    model: str | None,
    device: Any,
    precision: str,
    dtype: str,
    packing: bool,
    world: int,
    restarts: int | None,
    judges: dict[str, Any] | None,
) -> dict[str, Any]:
    """A training run's ``summary.json``: what ran (``describe_run``'s fields; ``model``: a
    model object's name in place of ``config.model``'s), the greedy evaluations ``before``
    and ``after``, the ``rows``' count and tokens sampled, the ``seconds`` this run took,
    what "auto" came to on this machine (``device``, the update's ``precision``, the compute
    ``dtype``, ``packing``), how many processes ran it (FSDP2's slices past one), the env
    workers Ray replaced, the last iteration's rubric parts and what the ``judges`` cost."""
    levels = {row["level"] for row in rows if row.get("level") is not None}
    run = describe_run(config, answer_format, tasks, levels, config.backend)
    if model is not None:
        run["model"] = model
    summary = {"interrupted": interrupted, **run, "before": before, "after": after}
    summary.update(iterations=len(rows), sampled_tokens=sampled_tokens(rows))
    summary.update(minutes_this_run=seconds / 60)
    summary.update(device=str(device), worker_restarts=restarts)
    summary.update(precision=precision, dtype=dtype, packing=packing)
    summary.update(config=dataclasses.asdict(config))
    summary.update(world_size=world, sharding="fsdp2" if world > 1 else None)
    if rows and rows[-1].get("parts"):  # a rubric's parts, as the last iteration paid them
        summary["parts"] = rows[-1]["parts"]
    if judges is not None:
        summary["judges"] = judges
    return summary


def stop_notes(error: BaseException) -> list[str]:
    """What the report of a run that ``error`` stopped says of it: the file the disk did
    not take, the signal, or another process's end (Ctrl-C: nothing more)."""
    if isinstance(error, RunWriteError):
        return [f"Stopped: {error}"]
    if isinstance(error, Interrupted):
        return [f"Stopped by {error}."]
    if isinstance(error, KeyboardInterrupt):
        return []
    said = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return [f"Stopped: another process of the run stopped ({type(error).__name__}: {said})."]


def write_summary(
    out: Path, summary: dict[str, Any], rows: list[dict[str, Any]], notes: list[str] = ()
) -> list[RunWriteError]:
    """Write a run's ``summary.json`` (``summary``: ``describe_run``'s fields, ``before`` and
    ``after`` evaluations, ``interrupted``), its plot of the metrics ``rows`` and
    ``report.md`` (with ``notes``). Each is written whole or not at all: a finished run raises
    the first ``RunWriteError``; a stopped one (``summary["interrupted"]``) writes what the
    disk takes and returns the errors of the others (their ``filename``: the path)."""
    unwritten: list[RunWriteError] = []

    def attempt(write: Any, *args: Any) -> bool:
        try:
            write(*args)
        except RunWriteError as error:
            if not summary["interrupted"]:
                raise
            unwritten.append(error)
            return False
        return True

    attempt(write_text, out / SUMMARY_FILE, json.dumps(summary, indent=2) + "\n")
    before, after = summary["before"], summary["after"]
    title = run_title(summary) + (" (interrupted)" if summary["interrupted"] else "")
    plotted = attempt(plot_training, rows, before, after, out / TRAINING_PLOT_FILE, title)
    numbers = [("iterations", len(rows))]
    for name, evaluation in (("before", before), ("after", after)):
        if evaluation is not None:
            numbers.append((f"greedy success {name}", evaluation["success"]))
    if rows:
        numbers.append(("sampled success, last iteration", rows[-1]["success"]))
    rows_ = [*run_rows(summary), *numbers]
    images = [out / TRAINING_PLOT_FILE] if plotted else []
    idle = [row["iteration"] for row in rows if row.get("trained_tokens") == 0]
    if idle:  # said, not hidden behind a loss of 0
        notes = [*notes, f"Iterations {', '.join(map(str, idle))} trained on no token: every "
                 "response was left out of the loss (--mask-truncated cut them all)."]  # fmt: skip
    attempt(write_report, out, f"Training: {title}", rows_, images, notes)
    return unwritten
