"""Learning cards: what training with a recipe does on a task, over seeds, to hold a run
against. A card keeps each seed's curve of one metric per iteration (default: ``success``,
the sampled success rate of the iteration's batch), their mean and standard error, the
greedy success before and after, and what made it (the run's options, llm_gym's version,
the dtype). ``llm-gym profile --compare RUN_DIR`` finds the card of the run's task and says,
iteration by iteration, where the run's curve lies against the card's band (mean ± 2 SE).

The cards shipped (``LEARNING_CARDS``) are made by ``scripts/learning_cards.py`` from the runs
of the docs' commands.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "CARD_OPTIONS",
    "Comparison",
    "LEARNING_CARDS",
    "compare_run",
    "comparison_text",
    "find_learning_card",
    "learning_card",
    "load_learning_card",
]

# The shipped cards, by name: package data beside this module.
LEARNING_CARDS = ("chain_sum", "guess")
# The options a run must share with a card for their curves to be comparable.
CARD_OPTIONS = (
    "env", "env_args", "model", "iterations", "groups", "group_size", "max_new_tokens",
    "temperature", "learning_rate", "loss_type", "advantage", "answer_format",
)  # fmt: skip
_METRICS, _CONFIG, _SUMMARY = "metrics.jsonl", "run_config.json", "summary.json"


def learning_card(runs: Sequence[str | Path], command: str, metric: str = "success") -> dict:
    """The card of training ``runs`` (one folder a seed, each with ``run_config.json``,
    ``metrics.jsonl`` and ``summary.json``), made with ``command``: each seed's ``metric``
    per iteration, their ``mean`` and ``se`` over the seeds, greedy success before and after.
    The runs must share every ``CARD_OPTIONS`` but the seed."""
    import llm_gym

    configs = [_read_json(Path(run) / _CONFIG) for run in runs]
    options = {name: configs[0].get(name) for name in CARD_OPTIONS}
    for run, config in zip(runs, configs, strict=True):
        differ = [n for n in CARD_OPTIONS if config.get(n) != options[n]]
        if differ:
            raise ValueError(f"runs must share their recipe; {run} differs in {differ}")
    curves = [_curve(Path(run), metric) for run in runs]
    if len({len(c) for c in curves}) != 1:
        raise ValueError(f"runs must have as many iterations; got {[len(c) for c in curves]}")
    summaries = [_read_json(Path(run) / _SUMMARY) for run in runs]
    values = np.array(curves, dtype=np.float64)
    se = values.std(axis=0, ddof=1) / math.sqrt(len(runs)) if len(runs) > 1 else 0 * values[0]
    return {
        "command": command, "metric": metric, "options": options,
        "llm_gym": llm_gym.__version__, "dtype": summaries[0].get("dtype"),
        "seeds": [c["seed"] for c in configs], "curves": [list(c) for c in curves],
        "mean": values.mean(axis=0).tolist(), "se": np.asarray(se).tolist(),
        "greedy_before": [s["before"]["success"] for s in summaries],
        "greedy_after": [s["after"]["success"] for s in summaries],
    }  # fmt: skip


def load_learning_card(name: str) -> dict:
    """The shipped card ``name`` (one of ``LEARNING_CARDS``)."""
    if name not in LEARNING_CARDS:
        raise ValueError(f"learning card must be one of {list(LEARNING_CARDS)}, got {name!r}")
    text = resources.files("llm_gym.run").joinpath(f"learning_cards/{name}.json").read_text()
    return json.loads(text)


def find_learning_card(config: Mapping[str, Any]) -> tuple[str, dict]:
    """The shipped card of a run's task: the one whose env is the run's and whose env
    arguments the run's include; a ``ValueError`` naming the cards there are if none."""
    for name in LEARNING_CARDS:
        card = load_learning_card(name)
        env, args = card["options"]["env"], card["options"]["env_args"] or {}
        given = config.get("env_args") or {}
        if config.get("env") == env and all(given.get(k) == v for k, v in args.items()):
            return name, card
    known = ", ".join(
        f"{n} ({c['options']['env']} {c['options']['env_args']})"
        for n, c in ((n, load_learning_card(n)) for n in LEARNING_CARDS)
    )
    raise ValueError(
        f"no learning card for {config.get('env')} with {config.get('env_args') or {}}; the "
        f"cards: {known}"
    )


def compare_run(run_dir: str | Path, card: Mapping[str, Any]) -> dict:
    """A training run against ``card``: per iteration the run's value of the card's metric,
    the card's mean and band (mean ± 2 SE, at least the seeds' range; a success rate's within
    [0, 1]), and where the run lies
    (``"below"``, ``"within"``, ``"above"``); the options in which the run's recipe differs
    from the card's; its greedy success before and after beside the card's."""
    run = Path(run_dir)
    config = _read_json(run / _CONFIG)
    curve = _curve(run, card["metric"])
    rows = []
    for i, value in enumerate(curve[: len(card["mean"])]):
        seeds = [c[i] for c in card["curves"]]
        low = min(card["mean"][i] - 2 * card["se"][i], min(seeds))
        high = max(card["mean"][i] + 2 * card["se"][i], max(seeds))
        if card["metric"] == "success":  # a share: the band stays within [0, 1]
            low, high = max(low, 0.0), min(high, 1.0)
        where = "below" if value < low else "above" if value > high else "within"
        rows.append({"iteration": i, "run": value, "mean": card["mean"][i], "low": low,
                     "high": high, "where": where})  # fmt: skip
    summary = _read_json(run / _SUMMARY) if (run / _SUMMARY).is_file() else {}
    differ = {
        name: {"run": config.get(name), "card": card["options"][name]}
        for name in CARD_OPTIONS
        if config.get(name) != card["options"][name]
    }
    return {
        "rows": rows, "differ": differ,
        "greedy_after": (summary.get("after") or {}).get("success"),
        "card_greedy_after": card["greedy_after"],
    }  # fmt: skip


def comparison_text(name: str, card: Mapping[str, Any], comparison: Mapping[str, Any]) -> str:
    """The comparison as ``llm-gym profile --compare`` prints it: a table a row an
    iteration, then what lay outside the band and how the recipes differ."""
    metric, rows = card["metric"], comparison["rows"]
    lines = [
        f"against learning card {name!r}: {card['command']} (seeds "
        f"{', '.join(map(str, card['seeds']))}, {card['dtype']}, llm_gym {card['llm_gym']})",
        f"| iteration | run's {metric} | card's mean | card's band | where |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(f"| {row['iteration']} | {row['run']:.3f} | {row['mean']:.3f} | "
                     f"{row['low']:.3f} to {row['high']:.3f} | {row['where']} |")  # fmt: skip
    counts = {w: sum(r["where"] == w for r in rows) for w in ("below", "within", "above")}
    lines.append(f"{counts['within']} of {len(rows)} iterations within the band, "
                 f"{counts['below']} below, {counts['above']} above")  # fmt: skip
    after, theirs = comparison["greedy_after"], comparison["card_greedy_after"]
    if after is not None:
        lines.append(
            f"greedy success after: {after:.3f}; the card's seeds "
            f"{', '.join(f'{v:.3f}' for v in theirs)} (mean {np.mean(theirs):.3f})"
        )
    for option, values in comparison["differ"].items():
        lines.append(f"the run's {option} is {values['run']!r}, the card's {values['card']!r}")
    return "\n".join(lines)


class Comparison:
    """``llm-gym profile --compare RUN_DIR``: the run against its task's card, checked when
    made (the folder, the card); ``run()`` writes ``comparison.md`` and ``comparison.png`` to
    ``out`` and returns the text."""

    def __init__(self, run_dir: str | Path, out: str | Path) -> None:
        self.run_dir, self.out = Path(run_dir), Path(out)
        self.name, self.card = find_learning_card(_read_json(self.run_dir / _CONFIG))
        self.comparison = compare_run(self.run_dir, self.card)

    def run(self) -> str:
        """Write and return the comparison."""
        from llm_gym.run.files import write_text
        from llm_gym.run.plots import plot_comparison

        text = comparison_text(self.name, self.card, self.comparison)
        self.out.mkdir(parents=True, exist_ok=True)
        write_text(self.out / "comparison.md", text + "\n")
        title = f"{self.run_dir.name} against the learning card {self.name!r}"
        plot_comparison(self.comparison["rows"], self.card["metric"],
                        self.out / "comparison.png", title)  # fmt: skip
        return text


def _curve(run: Path, metric: str) -> list[float]:
    path = run / _METRICS
    if not path.is_file():
        raise ValueError(f"{run} holds no {_METRICS}: not a training run's folder")
    values = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            break  # cut short by a stop
        value = row.get(metric) if isinstance(row, dict) else None
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ValueError(f"{path}: line {len(values) + 1} has no number {metric!r}")
        values.append(float(value))
    if not values:
        raise ValueError(f"{path} holds no iteration")
    return values


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise ValueError(f"{path.parent} holds no {path.name}: not a training run's folder")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError:
        raise ValueError(f"{path} is truncated or not JSON") from None
