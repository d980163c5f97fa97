"""``llm-gym rescore RUN_DIR``: a run's stored episodes scored again by today's reward.

A reward gets fixed; the ``episodes.jsonl`` of every earlier run still holds the old rule's
scores. Each ended episode's record names the version of the reward that scored it
(``reward_version``, the task's ``Task.reward_version``) and the item it played (``item``);
``rescore`` makes the run's task again from its config (``summary.json``'s or
``run_config.json``'s env, ``--env-arg`` values and answer format), scores each record's
final response against its item, and writes the new scores beside the old in
``rescored.jsonl`` (a line an episode) and ``rescore.json`` (the report): how many changed,
by how much, and which versions differ. ``episodes.jsonl`` is only read.

What it cannot score again, it counts and names: a record without an item (written before
versions were recorded, or by an env whose reward is its play, a game's or a workspace's,
which would have to be replayed), a run whose reward had judge parts (their models are not
asked again), an env that is not a task's.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from llm_gym.envs.dataset import DatasetChatEnv, task_function
from llm_gym.episodes.records import json_value
from llm_gym.run.config import RunConfig, rubric_weights
from llm_gym.run.describe import answer_format_of
from llm_gym.run.files import EPISODES_FILE, write_text
from llm_gym.run.lock import FolderLock

__all__ = ["RESCORED_FILE", "RESCORE_FILE", "report_text", "rescore", "rescore_lines"]

RESCORED_FILE = "rescored.jsonl"  # a line per episode: its old and its new score
RESCORE_FILE = "rescore.json"  # the report
_CONFIG_FILES = ("summary.json", "run_config.json")  # rollout's (under "config"), train's
_TOLERANCE = 1e-9  # a score that moved less did not change (floats through JSON)


def rescore(run_dir: str | Path) -> dict[str, Any]:
    """Score ``run_dir``'s episodes again (see the module); write ``rescored.jsonl`` and
    ``rescore.json`` there and return the report. A folder without episodes or a config,
    or a run whose reward cannot be made again here, is a ``ValueError`` naming it."""
    out = Path(run_dir)
    episodes = out / EPISODES_FILE
    if not out.is_dir():
        raise ValueError(f"run_dir {str(out)!r} is not a folder")
    if not episodes.is_file():
        raise ValueError(
            f"run_dir {str(out)!r} holds no {EPISODES_FILE}: rescore reads a rollout's "
            "episodes, or a training run's written with --log-episodes"
        )
    config = _run_config(out)
    records = _records(episodes)
    env = _task_env(config, [r["item"] for r in records if _has_item(r)])
    lines, report = rescore_lines(records, env, config)
    lock = FolderLock(out, flag="run_dir")  # not while a run writes there
    try:
        write_text(out / RESCORED_FILE, "".join(json.dumps(line) + "\n" for line in lines))
        write_text(out / RESCORE_FILE, json.dumps(report, indent=2) + "\n")
    finally:
        lock.release()
    return report


def rescore_lines(
    records: list[dict[str, Any]], env: DatasetChatEnv | None, config: RunConfig
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Each record's line of ``rescored.jsonl`` (the episode's ``line`` in the file, its old
    and new ``reward_task``, ``success`` and ``reward_version``, the new score's ``info``)
    and the report over them; ``env`` (None: no record has an item) scores the responses."""
    prefix = str(config.env_args.get("assistant_prefix", ""))
    lines, skipped, failed = [], 0, []
    version_now = None if env is None else env.reward_version
    for index, record in enumerate(records):
        if env is None or not _has_item(record):
            skipped += 1
            continue
        try:  # a record edited by hand may lack a field the reward reads: that record only
            score = env.score(prefix + str(record.get("response") or ""), record["item"])
        except (KeyError, TypeError, ValueError) as error:
            failed.append(f"line {index}: {type(error).__name__}: {error}")
            continue
        old = record.get("reward_task")
        old = record.get("reward") if old is None else old
        lines.append({
            "line": index,
            "reward_task": old, "reward_task_now": float(score.info.get("reward", score.reward)),
            "success": bool(record.get("success", False)),
            "success_now": bool(score.info.get("success", False)),
            "reward_version": record.get("reward_version"), "reward_version_now": version_now,
            "info_now": json_value(score.info),
        })  # fmt: skip
    changes = np.array([line["reward_task_now"] - (line["reward_task"] or 0.0) for line in lines])
    changed = [i for i, c in enumerate(changes) if abs(c) > _TOLERANCE]
    versions = Counter(
        f"{line['reward_version']} -> {line['reward_version_now']}"
        for line in lines
        if line["reward_version"] != line["reward_version_now"]
    )
    rescored = len(lines)
    report = {
        "env": config.env,
        "episodes": len(records),
        "rescored": rescored,
        "not_rescored": skipped,
        "failed": len(failed),
        "first_failure": failed[0] if failed else None,
        "reward_version_now": version_now,
        "changed": len(changed),
        "mean_change": float(changes.mean()) if rescored else 0.0,
        "largest_change": float(changes[np.abs(changes).argmax()]) if changed else 0.0,
        "success": _share(line["success"] for line in lines),
        "success_now": _share(line["success_now"] for line in lines),
        "versions_differ": dict(versions),
    }
    return lines, report


def report_text(report: Mapping[str, Any]) -> str:
    """The report in a few lines, as ``llm-gym rescore`` prints it.

    >>> print(report_text({"env": "E", "episodes": 4, "rescored": 4, "not_rescored": 0,
    ...     "reward_version_now": "2", "changed": 1, "mean_change": -0.25,
    ...     "largest_change": -1.0, "success": 0.5, "success_now": 0.25,
    ...     "versions_differ": {"1 -> 2": 4}}))
    rescored 4 of 4 episodes with E's reward today (version 2): 1 changed
      mean change -0.250, largest -1.000; success 0.500 -> 0.250
      reward versions differ: 1 -> 2 on 4 episodes
    """
    lines = [
        f"rescored {report['rescored']} of {report['episodes']} episodes with "
        f"{report['env']}'s reward today (version {report['reward_version_now']}): "
        f"{report['changed']} changed"
    ]
    if report["rescored"]:
        lines.append(
            f"  mean change {report['mean_change']:.3f}, largest {report['largest_change']:.3f}"
            f"; success {report['success']:.3f} -> {report['success_now']:.3f}"
        )
    differ = report["versions_differ"]
    lines.append(
        "  reward versions differ: "
        + ", ".join(f"{pair} on {count} episodes" for pair, count in differ.items())
        if differ
        else "  reward versions: the same"
    )
    if report.get("failed"):
        lines.append(
            f"  failed: {report['failed']} episodes whose item the reward could not read "
            f"({report['first_failure']})"
        )
    if report["not_rescored"]:
        lines.append(
            f"  not rescored: {report['not_rescored']} episodes whose records hold no item "
            "(written before reward versions, or an env whose reward is its play)"
        )
    return "\n".join(lines)


def _run_config(out: Path) -> RunConfig:
    # The run's own options: a rollout's summary.json holds them under "config", a training
    # run's run_config.json is them. Only RunConfig's fields matter here.
    for name in _CONFIG_FILES:
        path = out / name
        if not path.is_file():
            continue
        try:
            values = json.loads(path.read_text(encoding="utf-8"))
            values = values.get("config", values) if name == "summary.json" else values
            fields = {f.name for f in dataclasses.fields(RunConfig)}
            given = {k: v for k, v in values.items() if k in fields and k != "report_to"}
            return RunConfig(**given)
        except (ValueError, TypeError, AttributeError) as error:
            message = " ".join(str(error).split())
            raise ValueError(f"the run's config {path} is truncated or broken: {message}") from None
    raise ValueError(
        f"run_dir {str(out)!r} holds no {' or '.join(_CONFIG_FILES)}: the run's env and options "
        "are unknown (an interrupted rollout writes its summary as it stops)"
    )


def _records(path: Path) -> list[dict[str, Any]]:
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            break  # the line a stopped run cut short: the file's end
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{number} is not an episode's record (a JSON object)")
        records.append(record)
    if not records:
        raise ValueError(f"{path} holds no episodes")
    return records


def _task_env(config: RunConfig, items: list[Any]) -> DatasetChatEnv | None:
    # The run's task, made with its arguments, serving the stored items (already mapped to
    # the env's fields): its score() is the reward as the run's env computed it.
    function = task_function(config.env)
    if function is None:
        raise ValueError(
            f"{config.env} is not a task env (LLMChat-<task>-v0): its reward is its play, which "
            "rescore does not replay"
        )
    if rubric_weights(config.rubric) != {"task": 1.0}:
        raise ValueError(
            f"the run's reward was the rubric {config.rubric!r}: rescore scores the task's own "
            "reward and asks no judge again"
        )
    if not items:
        return None
    arguments = {**config.env_args, "answer_format": answer_format_of(config)}
    arguments = {k: v for k, v in arguments.items() if v is not None and k != "assistant_prefix"}
    own = inspect.signature(function).parameters
    task = function(**{k: v for k, v in arguments.items() if k in own})
    served = dataclasses.replace(task, source=items, field_map=None)
    return DatasetChatEnv.from_task(served, shuffle=False)


def _has_item(record: Mapping[str, Any]) -> bool:
    return isinstance(record.get("item"), Mapping) and isinstance(record["item"].get("query"), str)


def _share(values: Any) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0
