"""Rollouts of a model on a chat task, the job behind ``llm-gym rollout`` (docs/cli.md: one
vector env, one batched generation a step, episodes saved as they end).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from llm_gym.envs import single_env
from llm_gym.episodes import ARRAYS, AsyncEpisodes, Episode, Episodes
from llm_gym.episodes.summary import Summary, rubric_part_names, summarize
from llm_gym.lm.loading import load_model
from llm_gym.rewards.answers import ANSWER_FORMATS
from llm_gym.run.budget import check_run
from llm_gym.run.config import RolloutConfig
from llm_gym.run.describe import describe_run, run_rows, run_title
from llm_gym.run.files import EPISODES_FILE, LineFile, RunWriteError, told, write_text
from llm_gym.run.lock import FolderLock
from llm_gym.run.plots import plot_rollout
from llm_gym.run.report import REPORT_FILE, write_report
from llm_gym.run.setup import (
    async_episodes,
    charge_kl,
    dtype_name,
    make_policy,
    reference_scorer,
    resolve_device,
    resolve_dtype,
    run_rubric,
    task_envs,
)
from llm_gym.run.signals import hold_signals
from llm_gym.run.trackers import Trackers, clear_trackers
from llm_gym.samplers import SamplerError

__all__ = [
    "ARRAYS",
    "EPISODES_FILE",
    "ROLLOUT_PLOT_FILE",
    "SUMMARY_FILE",
    "Rollout",
    "RolloutConfig",
    "format_hint",
    "prepare_out",
]

PROCEDURAL_EPISODES = 64  # the default for tasks without a fixed size
SUMMARY_FILE = "summary.json"
ROLLOUT_PLOT_FILE = "rollout.png"
LOW_FORMAT_RATE = 0.1  # at or below: the table hints at another --answer-format


def prepare_out(out: Path) -> Path:
    """Create the run folder with an empty episodes file and no earlier run's summary or plot
    (an interrupted run must not leave another run's summary beside its episodes)."""
    out.mkdir(parents=True, exist_ok=True)
    for name in (EPISODES_FILE, SUMMARY_FILE, ROLLOUT_PLOT_FILE, REPORT_FILE):
        (out / name).unlink(missing_ok=True)
    clear_trackers(out)
    return out / EPISODES_FILE


class Rollout:
    """A prepared run (models, envs, run folder; any input error raised here); ``run()`` runs it.
    The run folder is this run's alone (``FolderLock``) from here to the end of ``run()``."""

    def __init__(self, config: RolloutConfig) -> None:
        self.config = config
        self.out = Path(config.out)
        self.policy: Any = None
        self.lock = FolderLock(self.out)  # before the folder is looked at
        try:
            self._prepare(config)
        except BaseException:  # no server is left running after a setup error
            self.close()
            self.lock.release()
            raise

    def _prepare(self, config: RolloutConfig) -> None:
        episodes = self.out / EPISODES_FILE  # two runs' episodes never mix in one file
        if episodes.exists() and not config.overwrite:
            done = sum(1 for line in episodes.read_text(encoding="utf-8").splitlines() if line)
            raise FileExistsError(
                f"{episodes} already holds {done} episodes from an earlier run; pass another "
                "--out, or --overwrite to start over"
            )
        device = resolve_device(config.device)
        dtype = resolve_dtype(config.dtype, device)
        # Sizes checked before anything is allocated: a sub-env per conversation.
        turns = config.max_tool_calls + 1 if config.tools else 1
        tokens = config.max_new_tokens * turns + 1
        local = config.backend == "transformers"  # else a server generates, in its memory
        batches = [("--num-envs", config.num_envs, tokens, False)] if local else []
        records = None if config.episodes is None else ("--episodes", config.episodes)
        check_run(config, device, batches, records, dtype=dtype_name(dtype))
        model, tokenizer = load_model(config.model, device=device, dtype=dtype)
        context = getattr(model.config, "max_position_embeddings", None)
        if context is not None and config.max_new_tokens >= context:
            raise ValueError(
                f"max_new_tokens={config.max_new_tokens} leaves no room for a prompt in the "
                f"model's context of {context} tokens"
            )
        self.policy = make_policy(model, tokenizer, config)
        self._set_up(config, tokenizer)

    def _set_up(self, config: RolloutConfig, tokenizer: Any) -> None:
        self.rubric = run_rubric(config, tokenizer)
        options = {"split": config.split, "data_dir": config.data_dir}
        options.update(self.rubric.env_options())
        envs = task_envs(config, tokenizer, config.num_envs, **options)
        self.part_names = rubric_part_names(envs)
        if config.episodes is None:
            epoch = getattr(envs.unwrapped, "epoch_size", None)
            self.config = config = replace(config, episodes=epoch or PROCEDURAL_EPISODES)
        # What the env plays, read now: the summary is written after the envs are closed.
        # (The env got answer_format_of(config), if anything: it holds the format played.)
        self.answer_format = getattr(single_env(envs), "answer_format", None)
        self.start_level = getattr(envs.unwrapped, "level", None)
        self.task_names: set[str] = set()  # as the env's reset info names them
        self.driver: AsyncEpisodes | None = None
        self.ref: Any = None  # the asynchronous driver's reference scorer (a Ray actor's)
        if config.asynchronous:  # the vector env only told what the task is
            envs.close()
            if config.ref_model is not None:
                self.ref = reference_scorer(config, config.ref_model)
            schedule = envs.schedule if config.curriculum else None  # shared by every sub-env
            # The same options as the vector env's (--split, --data-dir).
            self.driver = async_episodes(
                config, tokenizer, self.policy, config.num_envs, ref=self.ref,
                curriculum=schedule, **options,
            )  # fmt: skip
            envs = self.driver
        elif config.ref_model is not None:
            envs = charge_kl(envs, config, config.ref_model)
        self.envs = envs
        self.episodes_path = prepare_out(self.out)

    def run(self) -> Summary:
        """Run the episodes; write episodes (as they finish), then summary, plot and report,
        also on Ctrl-C (``KeyboardInterrupt``), a failed sampler (``SamplerError``) or a file
        the disk cannot take (``RunWriteError``, one line naming it), each re-raised, for the
        episodes finished so far; the run folder is let go at the end."""
        try:
            return self._run()
        finally:
            self.lock.release()

    def _run(self) -> Summary:
        torch.manual_seed(self.config.seed)
        items: list[dict[str, Any]] = []
        start = time.perf_counter()
        trackers = Trackers(self.config.report_to, self.out, asdict(self.config))
        try:
            self._collect(items, start, trackers)
        except (KeyboardInterrupt, SamplerError, RunWriteError) as error:
            hold_signals()  # a second Ctrl-C or a SIGTERM waits for the summary
            trackers.finish(asdict(self._stopped(items, start, error)), len(items))
            raise
        finally:
            self.envs.close()
            self.close()
        try:
            summary = self.write(items, time.perf_counter() - start)
        except RunWriteError as error:
            hold_signals()
            trackers.finish(asdict(self._stopped(items, start, error)), len(items))
            raise
        trackers.finish(asdict(summary), len(items), self.out / ROLLOUT_PLOT_FILE)
        return summary

    def _stopped(self, items: list[dict[str, Any]], start: float, error: BaseException) -> Summary:
        # The summary, marked interrupted, as far as the disk takes it; a RunWriteError then
        # says in its one line whether the summary was written.
        seconds = time.perf_counter() - start
        summary = self.write(items, seconds, interrupted=True, stopped_by=error)
        if isinstance(error, RunWriteError):
            error.strerror = f"{error.strerror}; {told(self.out / SUMMARY_FILE, self.unwritten)}"
        return summary

    def close(self) -> None:
        """Stop the sampler's server and the reference's Ray actor, if any (also done when
        ``run()`` ends)."""
        for part in (self.policy, getattr(self, "ref", None), getattr(self, "rubric", None)):
            close = getattr(part, "close", None)
            if close is not None:
                close()

    def write(
        self,
        items: list[dict[str, Any]],
        seconds: float,
        interrupted: bool = False,
        stopped_by: BaseException | None = None,
    ) -> Summary:
        """Write ``summary.json``, the plot and ``report.md`` for finished episodes ``items``,
        each whole or not at all; their ``Summary``. A finished run raises the first file the
        disk cannot take (``RunWriteError``); an ``interrupted`` one writes what the disk takes
        (``unwritten``: the others' errors)."""
        config = self.config
        summary = summarize(items, seconds, self.part_names)
        summary = replace(summary, judges=self.rubric.stats())
        hint = format_hint(items, self.answer_format, config.max_new_tokens)
        restarts = self.driver.restarts if self.driver and config.ray_address else None
        summary = replace(summary, hint=hint, worker_restarts=restarts)
        names = self.task_names | {str(r["task"]) for r in items if r.get("task") is not None}
        levels = {r["level"] for r in items if r.get("level") is not None}
        if not levels and self.start_level is not None:  # no curriculum: one fixed level
            levels = {self.start_level}
        run = describe_run(config, self.answer_format, names, levels, config.backend)
        record = {
            "interrupted": interrupted,
            **run,
            "summary": asdict(summary),
            "config": asdict(config),
        }
        self.unwritten: list[RunWriteError] = []  # an interrupted run's files not written

        def attempt(write: Any, *args: Any) -> bool:
            try:
                write(*args)
            except RunWriteError as error:
                if not interrupted:
                    raise
                self.unwritten.append(error)
                return False
            return True

        attempt(write_text, self.out / SUMMARY_FILE, json.dumps(record, indent=2) + "\n")
        title = run_title(run)
        if interrupted:
            title += " (interrupted)"
        plotted = attempt(plot_rollout, items, self.out / ROLLOUT_PLOT_FILE, title)
        rows = [*run_rows(run), *summary.rows()]
        notes = [hint] if hint else []
        if interrupted:
            why = f": {stopped_by}" if isinstance(stopped_by, RunWriteError) else ""
            notes.insert(0, f"Interrupted after {len(items)} of {config.episodes} episodes{why}.")
        images = [self.out / ROLLOUT_PLOT_FILE] if plotted else []
        attempt(write_report, self.out, f"Rollout: {title}", rows, images, notes)
        return summary

    def _collect(self, items: list[dict[str, Any]], start: float, trackers: Trackers) -> None:
        # Appends each finished episode to ``items`` as it ends, so Ctrl-C loses none of them;
        # the trackers get its numbers at its index.
        config = self.config
        records = self._async_records() if self.driver else self._sync_records()
        generated, correct = 0, 0
        bar = tqdm(
            total=config.episodes, unit="ep", disable=not config.progress, dynamic_ncols=True
        )
        with bar, LineFile(self.episodes_path) as f:
            for episode in records:
                kept = {k: v for k, v in episode.record().items() if k not in ARRAYS}
                record = {"episode": len(items), **kept}
                # A line per finished episode, whole, readable after Ctrl-C.
                f.write(json.dumps(record, ensure_ascii=False))
                items.append(record)
                trackers.log(record, record["episode"])
                generated += record["num_tokens"]
                correct += bool(record.get("success", False))
                bar.update(1)
                elapsed = time.perf_counter() - start
                bar.set_postfix(
                    tok_s=f"{generated / elapsed:.1f}", acc=f"{correct / max(len(items), 1):.3f}"
                )
                if len(items) == config.episodes:
                    break  # the last batch may finish more episodes than were asked for

    def _sync_records(self) -> Iterator[Episode]:
        # The vector env: one batched generation a step, every sub-env stepped together.
        obs, info = self.envs.reset(seed=self.config.seed)
        self.task_names.update(str(t) for t in info.get("task", ()) if t is not None)
        running = Episodes(self.envs, obs)
        while True:
            yield from running.step(self.policy(running.obs))

    def _async_records(self) -> Iterator[Episode]:
        # The asynchronous driver: episodes in the order they finish, each with its item.
        yield from self.driver.play(self.config.episodes)


def _numeric(answer: Any) -> bool:
    """Whether a ground-truth answer is a number (GSM8K's: the number after its ``####``)."""
    text = str(answer).rsplit("####", 1)[-1].strip().replace(",", "")
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def format_hint(
    items: list[dict[str, Any]], answer_format: str | None, max_new_tokens: int
) -> str | None:
    """A line saying which ``--answer-format`` (or ``--max-new-tokens``) to try when at most
    ``LOW_FORMAT_RATE`` of the episodes ``items`` gave an answer in ``answer_format``; None
    otherwise, or without episodes or an answer part to count.

    ``last_number`` is named only when every ground-truth answer is a number (the last
    number of a response is then a fair reading of its answer); otherwise the other formats.
    """
    scored = [r for r in items if r.get("reward_answer") is not None]
    if not scored:
        return None
    rate = sum(float(r["reward_answer"]) > 0 for r in scored) / len(scored)
    if rate > LOW_FORMAT_RATE:
        return None
    line = f"hint: {rate:.0%} of responses gave an answer in the {answer_format!r} format"
    answers = [r.get("answer") for r in scored]
    cut = sum(r.get("num_tokens", 0) >= max_new_tokens for r in scored) / len(scored)
    if cut >= 0.5:  # the answer may simply not have fit
        line += f"; {cut:.0%} were cut at --max-new-tokens {max_new_tokens}: try a larger one"
    if answer_format != "last_number" and all(a is not None and _numeric(a) for a in answers):
        line += "; this task's answers are numbers: try --answer-format last_number"
    elif answer_format != "last_number":
        others = [name for name in ANSWER_FORMATS if name not in (answer_format, "last_number")]
        line += f"; try --answer-format {' or '.join(others)}, or a larger --model"
    elif cut < 0.5:
        line += "; the model rarely writes a number here: try a larger --model"
    return line
