"""Experiment trackers a run reports to while it runs (``--report-to``): TensorBoard, Weights
& Biases, Trackio and MLflow, each through its own library and offline by default.

What each receives: every metrics row as scalars at its step (the names of
``metrics.jsonl``, a nested dict's keys joined by ``/``: ``parts/right``), the run's config,
the summary's scalars (``before/success``, ``after/success``, ...) and the run's plot as an
image where the tracker takes one. Where each writes:

- ``tensorboard``: event files in the run folder itself (``tensorboard --logdir runs`` shows
  each run under its folder's name);
- ``wandb``: an offline run under ``<out>/wandb`` (``WANDB_MODE``, ``WANDB_DIR`` and
  ``WANDB_PROJECT`` are W&B's own and win; ``wandb sync`` uploads it);
- ``trackio``: Trackio's local database (``TRACKIO_DIR``; ``trackio show`` serves it);
- ``mlflow``: MLflow's tracking URI (``MLFLOW_TRACKING_URI``, else MLflow's default, a SQLite
  file in the working directory), experiment ``MLFLOW_EXPERIMENT_NAME`` or ``llm-gym``.

A resumed run continues the same tracker runs (their ids are kept in ``<out>/trackers.json``,
every tracker's the run ever reported to, whatever a resume's ``--report-to``).
A tracker that fails mid-run is dropped with a warning: it never costs the run. Deliberately
not accelerate's trackers: they start through ``PartialState``, which would join process
groups the trainer manages itself, and they do not keep a run's ids for a resume.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import socket
import time
import urllib.parse
import uuid
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from llm_gym.run.files import write_text

__all__ = [
    "TRACKERS",
    "TRACKERS_FILE",
    "Tracker",
    "Trackers",
    "check_report_to",
    "clear_trackers",
    "report_to",
    "scalars",
]

TRACKERS = ("tensorboard", "wandb", "trackio", "mlflow")
TRACKERS_FILE = "trackers.json"  # the tracker runs' ids, which a resumed run continues
PROJECT = "llm-gym"  # W&B's project, Trackio's project and MLflow's experiment by default
EXTRA = "pip install 'llm-gym[tracking]'"
REACH_SECONDS = 3.0  # how long a tracking server may take to accept a connection


def report_to(text: str) -> list[str]:
    """``--report-to``'s trackers: comma-separated names of ``TRACKERS``, ``all``, or
    ``none`` (no tracker).

    >>> report_to("tensorboard,wandb"), report_to("none")
    (['tensorboard', 'wandb'], [])
    >>> report_to("comet")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: report_to (--report-to) takes none, all or comma-separated names of ..., got 'comet'
    """
    names = [name.strip() for name in text.split(",") if name.strip()]
    if names == ["all"]:
        return list(TRACKERS)
    if names == ["none"]:
        return []
    if not names or any(name not in TRACKERS for name in names):
        raise ValueError(
            "report_to (--report-to) takes none, all or comma-separated names of "
            f"{list(TRACKERS)}, got {text!r}"
        )
    return list(dict.fromkeys(names))


def check_report_to(names: Sequence[str]) -> None:
    """Raise ``ValueError`` (one line, naming what to install) unless each tracker of
    ``names`` is one of ``TRACKERS`` and its package is installed: before anything loads."""
    if isinstance(names, str) or not all(name in TRACKERS for name in names):
        raise ValueError(f"report_to (--report-to) takes names of {list(TRACKERS)}, got {names!r}")
    missing = [name for name in names if importlib.util.find_spec(name) is None]
    if missing:
        raise ValueError(
            f"report_to (--report-to) {missing[0]!r} is not installed: {EXTRA} (all four "
            f"trackers) or pip install {' '.join(missing)}"
        )


def clear_trackers(out: Path) -> None:
    """Remove what trackers wrote into the run folder ``out`` (a run started over): the
    ids file, TensorBoard's event files, W&B's offline runs."""
    (out / TRACKERS_FILE).unlink(missing_ok=True)
    for path in out.glob("events.out.tfevents.*"):
        path.unlink()
    shutil.rmtree(out / "wandb", ignore_errors=True)


def scalars(row: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The numbers of a metrics row, as trackers take them: nested dicts flattened with
    ``/``, booleans as 0/1; text, lists and ``None`` (a metric this step did not have) left
    out.

    >>> scalars({"reward": 0.5, "kl": None, "parts": {"right": 1}, "versions": [0], "ok": True})
    {'reward': 0.5, 'parts/right': 1.0, 'ok': 1.0}
    """
    out: dict[str, float] = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(scalars(value, f"{name}/"))
        elif isinstance(value, (bool, int, float)) and not isinstance(value, complex):
            out[name] = float(value)
    return out


class Tracker(Protocol):
    """One tracker's run: scalars at a step, an image, the end."""

    def log(self, values: Mapping[str, float], step: int) -> None: ...

    def image(self, name: str, path: Path, step: int) -> None: ...

    def finish(self, summary: Mapping[str, float]) -> None: ...


def _flat_config(config: Mapping[str, Any]) -> dict[str, str | float]:
    # Trackers' config views take flat keys with plain values; anything else as JSON.
    flat: dict[str, str | float] = {}
    for key, value in config.items():
        if isinstance(value, Mapping) and value:
            flat.update({f"{key}.{k}": v for k, v in _flat_config(value).items()})
        elif isinstance(value, (bool, int, float, str)):
            flat[key] = value
        else:
            flat[key] = json.dumps(value)
    return flat


class _TensorBoard:
    def __init__(self, out: Path, config: Mapping[str, Any], start: int, ids: dict) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: a resumed run's events drop what a stopped run wrote past its checkpoint.
        self.writer = SummaryWriter(str(out), purge_step=start or None)
        if not start:
            text = json.dumps(dict(config), indent=2, default=str)
            self.writer.add_text("config", "```json\n" + text + "\n```", 0)

    def log(self, values: Mapping[str, float], step: int) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def image(self, name: str, path: Path, step: int) -> None:
        from matplotlib.image import imread

        self.writer.add_image(name, imread(path)[..., :3], step, dataformats="HWC")

    def finish(self, summary: Mapping[str, float]) -> None:
        self.writer.close()


class _WandB:
    def __init__(self, out: Path, config: Mapping[str, Any], start: int, ids: dict) -> None:
        import wandb

        ids.setdefault("id", uuid.uuid4().hex[:12])
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", PROJECT), name=out.name, id=ids["id"],
            dir=os.environ.get("WANDB_DIR", str(out)), config=dict(config),
            mode=os.environ.get("WANDB_MODE", "offline"), resume="allow",
            settings=wandb.Settings(silent=True, console="off"),
        )  # fmt: skip

    def log(self, values: Mapping[str, float], step: int) -> None:
        self.run.log(dict(values), step=step)

    def image(self, name: str, path: Path, step: int) -> None:
        import wandb

        self.run.log({name: wandb.Image(str(path))}, step=step)

    def finish(self, summary: Mapping[str, float]) -> None:
        self.run.summary.update(dict(summary))
        self.run.finish()


class _Trackio:
    def __init__(self, out: Path, config: Mapping[str, Any], start: int, ids: dict) -> None:
        import trackio

        # Trackio knows a run by its name alone: the run folder's with a suffix of its own,
        # kept for a resume, so that two runs whose folders share a name never mix.
        name = ids.setdefault("name", f"{out.name}-{uuid.uuid4().hex[:6]}")
        self.run = trackio.init(
            project=ids.setdefault("project", PROJECT), name=name, config=dict(config),
            resume="allow" if start else "never", embed=False,
        )  # fmt: skip

    def log(self, values: Mapping[str, float], step: int) -> None:
        self.run.log(dict(values), step=step)

    def image(self, name: str, path: Path, step: int) -> None:
        import trackio

        self.run.log({name: trackio.Image(str(path))}, step=step)

    def finish(self, summary: Mapping[str, float]) -> None:
        self.run.finish()


class _MLflow:
    def __init__(self, out: Path, config: Mapping[str, Any], start: int, ids: dict) -> None:
        import mlflow
        from mlflow.entities import Param

        # A client of its own: MLflow's global active run stays the caller's.
        uri = ids.setdefault("uri", mlflow.get_tracking_uri())
        _check_reachable(uri)
        self.client = mlflow.MlflowClient(uri)
        if "run_id" in ids:  # a resumed run
            self.run_id = ids["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
            return
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", PROJECT)
        experiment = self.client.get_experiment_by_name(name)
        found = experiment.experiment_id if experiment else self.client.create_experiment(name)
        ids["run_id"] = self.client.create_run(found, run_name=out.name).info.run_id
        limit = mlflow.utils.validation.MAX_PARAM_VAL_LENGTH
        params = [Param(k, str(v)[:limit]) for k, v in _flat_config(config).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params a call
            self.client.log_batch(ids["run_id"], params=params[i : i + 100])
        self.run_id = ids["run_id"]

    def log(self, values: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, step) for k, v in values.items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def image(self, name: str, path: Path, step: int) -> None:
        self.client.log_artifact(self.run_id, str(path))

    def finish(self, summary: Mapping[str, float]) -> None:
        self.client.set_terminated(self.run_id)


def _check_reachable(uri: str, seconds: float = REACH_SECONDS) -> None:
    # A tracking server that does not answer: said at once, where MLflow's client would retry
    # for minutes (its requests back off up to seven times) before its first error.
    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        return
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        socket.create_connection((parsed.hostname, port), timeout=seconds).close()
    except OSError as error:
        raise ConnectionError(
            f"its tracking server at {uri} did not answer within {seconds:g} s ({error})"
        ) from None


# The trackers that take a training run's rows at once: a resume purges what it redoes.
_LIVE = ("tensorboard",)
_OPEN = {"tensorboard": _TensorBoard, "wandb": _WandB, "trackio": _Trackio, "mlflow": _MLflow}


class Trackers:
    """The trackers a run reports to, opened on its run folder ``out``: each called in turn,
    one that raises dropped with a warning (the run goes on and its files hold everything).

    ``start`` > 0 continues the tracker runs of an earlier run from step ``start``, with the
    ids ``out/trackers.json`` keeps.

    ``hold`` (a training run's): a row reaches the trackers when a checkpoint holds it
    (``commit``), so that a run stopped past its last checkpoint and resumed logs each
    iteration once, the resumed value; only TensorBoard, which drops what a resumed run
    redoes (``purge_step``), gets each row at once. A stopped run's summary is no step.
    """

    def __init__(
        self,
        names: Sequence[str],
        out: Path,
        config: Mapping[str, Any],
        start: int = 0,
        hold: bool = False,
    ) -> None:
        self.out, self.open_, self.hold = Path(out), {}, hold
        self.pending: list[tuple[dict[str, float], int]] = []  # held rows, for commit
        path = self.out / TRACKERS_FILE
        saved = json.loads(path.read_text()) if start and path.is_file() else {}
        self.ids: dict[str, dict[str, str]] = {}
        for name in names:
            ids = self.ids[name] = dict(saved.get(name, {}))
            with self._guard(name, "could not start"):
                self.open_[name] = _OPEN[name](self.out, config, start, ids)
        if self.ids:  # every tracker's ids the run ever had, for a later resume with it
            write_text(path, json.dumps({**saved, **self.ids}, indent=2) + "\n")

    @classmethod
    def none(cls) -> Trackers:
        """No tracker (a process past the first, or ``--report-to none``)."""
        return cls([], Path("."), {})

    @contextlib.contextmanager
    def _guard(self, name: str, what: str) -> Iterator[None]:
        try:
            yield
        except Exception as error:  # a tracker's failure never costs the run
            self.open_.pop(name, None)
            warnings.warn(
                f"--report-to {name} {what} ({type(error).__name__}: {error}); the run goes "
                f"on without it, its metrics are in {self.out}",
                RuntimeWarning,
                stacklevel=3,
            )

    def log(self, row: Mapping[str, Any], step: int) -> None:
        """Every number of ``row`` (``scalars``) to every tracker at ``step`` (held ones: at
        the next ``commit`` past it)."""
        values = scalars(row)
        if self.hold:
            self.pending.append((values, step))
        self._send(values, step, held=not self.hold)

    def commit(self, upto: int) -> None:
        """A checkpoint holds the rows before step ``upto``: the held trackers get them."""
        ready = [(values, step) for values, step in self.pending if step < upto]
        self.pending = [(values, step) for values, step in self.pending if step >= upto]
        for values, step in ready:
            self._send(values, step, held=True, live=False)

    def _send(self, values: dict[str, float], step: int, held: bool, live: bool = True) -> None:
        # To the trackers that take rows at once (live) and, with held, to the others.
        for name, tracker in list(self.open_.items()):
            if (name in _LIVE and live) or (name not in _LIVE and held):
                with self._guard(name, "failed"):
                    tracker.log(values, step)

    def finish(self, summary: Mapping[str, Any], step: int, image: Path | None = None) -> None:
        """The run's end: the numbers of ``summary`` (``before/success``, ...; its config
        the trackers had at the start) and the plot ``image`` at ``step``, then each
        tracker's run closed."""
        values = scalars({key: value for key, value in summary.items() if key != "config"})
        stopped = self.hold and bool(summary.get("interrupted"))
        if not stopped:  # a finished run's last rows are its last checkpoint's
            self.commit(step)
        self.pending = []  # a stopped run's rows past its checkpoint: its resume logs them
        for name, tracker in list(self.open_.items()):
            with self._guard(name, "failed"):
                if not stopped:  # a stopped run's summary is no iteration's step
                    tracker.log(values, step)
                if image is not None and image.is_file():
                    tracker.image(image.stem, image, step)
            with self._guard(name, "could not finish"):
                tracker.finish(values)
        self.open_.clear()
