"""The figures a run draws, as PNGs read at a glance: a rollout's reward and success by level
(or by position in the run) with its answer-format rate; a training run's reward and success
per iteration with the greedy evaluation before and after, KL, response length and level.

The numbers each figure draws come from small pure functions (``episode_groups``,
``running_mean``), which the tests check; pixels are not asserted on.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from llm_gym.episodes.summary import answer_format_held
from llm_gym.run.files import write_file

__all__ = [
    "Group",
    "episode_groups",
    "plot_comparison",
    "plot_rollout",
    "plot_training",
    "running_mean",
]

POSITION_BINS = 8  # bars of a run without levels: its episodes in this many equal bins


@dataclass(frozen=True)
class Group:
    """Episodes drawn as one bar: a label, how many, and their means."""

    label: str
    episodes: int
    reward: float
    success: float
    format_rate: float  # share of responses with an answer in the asked format
    kl: float | None  # mean KL per token; None without KL


def episode_groups(
    items: Sequence[dict[str, Any]], bins: int = POSITION_BINS
) -> tuple[str, list[Group]]:
    """``items`` (episode records) grouped by ``level`` when they carry one, else by position in
    the run in up to ``bins`` equal runs of episodes; the x axis' name and the groups.

    >>> name, groups = episode_groups([{"reward": 1.0, "success": True, "level": 0},
    ...                                {"reward": 0.0, "success": False, "level": 0}])
    >>> name, groups[0].label, groups[0].episodes, groups[0].reward
    ('level', '0', 2, 0.5)
    """
    if any(r.get("level") is not None for r in items):
        levels = sorted({r.get("level") for r in items}, key=lambda v: (v is None, v or 0))
        parts = [(str(v), [r for r in items if r.get("level") == v]) for v in levels]
        return "level", [_group(label, part) for label, part in parts]
    size = max(1, math.ceil(len(items) / bins))
    parts = [(f"{i}-{min(i + size, len(items)) - 1}", items[i : i + size])
             for i in range(0, len(items), size)]  # fmt: skip
    return "episodes (in run order)", [_group(label, part) for label, part in parts]


def _group(label: str, items: Sequence[dict[str, Any]]) -> Group:
    kls = [r["kl_mean"] for r in items if r.get("kl_mean") is not None]
    return Group(
        label=label,
        episodes=len(items),
        reward=float(np.mean([r["reward"] for r in items])),
        success=float(np.mean([bool(r.get("success", False)) for r in items])),
        format_rate=float(np.mean([answer_format_held(r) or False for r in items])),
        kl=float(np.mean(kls)) if kls else None,
    )


def running_mean(values: Sequence[float | None], window: int = 5) -> np.ndarray:
    """The mean of each value and the up to ``window - 1`` before it (None: skipped), so the
    first points are means of fewer values.

    >>> running_mean([1.0, 3.0, None, 5.0], 2).tolist()
    [1.0, 2.0, 3.0, 5.0]
    """
    array = _floats(values)
    out = np.full(len(array), np.nan)
    for i in range(len(array)):
        seen = array[max(0, i - window + 1) : i + 1]
        if not np.isnan(seen).all():
            out[i] = np.nanmean(seen)
    return out


def _floats(values: Sequence[Any]) -> np.ndarray:
    """``values`` as floats, None as NaN (no point drawn)."""
    return np.array([np.nan if v is None else v for v in values], dtype=float)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # no display: write the file only
    import matplotlib.pyplot as plt

    return plt


def plot_rollout(items: Sequence[dict[str, Any]], path: Path, title: str) -> None:
    """A rollout's PNG: mean reward and success per level (or per run of episodes), each bar's
    episode count above it; the answer-format rate per group; KL per token only with KL."""
    plt = _pyplot()
    name, groups = episode_groups(items)
    has_kl = any(g.kl is not None for g in groups)
    fig, axes = plt.subplots(2 + has_kl, 1, figsize=(8, 3.2 * (2 + has_kl)), squeeze=False)
    axes = axes[:, 0]
    fig.suptitle(title, fontsize=11)
    if not groups:
        axes[0].text(0.5, 0.5, "no episode finished", ha="center", transform=axes[0].transAxes)
    x = np.arange(len(groups))
    labels = [g.label for g in groups]
    ax = axes[0]
    ax.bar(x - 0.2, [g.reward for g in groups], 0.4, label="mean reward")
    ax.bar(x + 0.2, [g.success for g in groups], 0.4, label="success rate")
    for xi, g in zip(x, groups, strict=True):
        top = max(g.reward, g.success, 0.0)
        ax.annotate(f"n={g.episodes}", (xi, top), ha="center", va="bottom", fontsize=8)
    ax.set_title(f"reward and success by {name.split(' ')[0]}", fontsize=10)
    ax.set_ylim(min([0.0] + [g.reward for g in groups]) - 0.05, 1.15)  # KL can push it < 0
    ax.legend(fontsize=8, loc="upper right")
    ax = axes[1]
    ax.bar(x, [g.format_rate for g in groups], 0.6, color="tab:green")
    ax.set_ylim(0, 1.05)
    ax.set_title("answer-format rate (share of responses with an answer in the asked format)",
                 fontsize=10)  # fmt: skip
    if has_kl:
        ax = axes[2]
        ax.bar(x, [np.nan if g.kl is None else g.kl for g in groups], 0.6, color="tab:purple")
        ax.set_title("KL to the reference model", fontsize=10)
        ax.set_ylabel("nats / token", fontsize=9)
    for ax in axes:
        ax.set_xticks(x, labels, fontsize=8)
    axes[-1].set_xlabel(name)
    _save(fig, path)


def plot_training(
    rows: Sequence[dict[str, Any]],
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
    path: Path,
    title: str,
) -> None:
    """A training run's PNG from its per-iteration metrics ``rows`` (``iteration``, ``reward``,
    ``success``, ``kl``, ``response_tokens``, ``level``): reward and success per iteration with
    their running means, and the greedy ``success`` of the evaluation ``before`` (at 0) and
    ``after`` (after the last iteration) marked; KL (only when there is KL), the update's
    diagnostics (``entropy``, ``clip_fraction``, ``approx_kl``, where the rows hold them),
    response length, and the level when it moves, each in its own panel."""
    plt = _pyplot()
    steps = np.array([r["iteration"] for r in rows], dtype=float)
    has_kl = any(r.get("kl") is not None for r in rows)
    levels = [r.get("level") for r in rows]
    moved = len({v for v in levels if v is not None}) > 1
    has_update = any(r.get("entropy") is not None for r in rows)
    panels = 2 + has_kl + has_update + moved
    fig, axes = plt.subplots(panels, 1, figsize=(8, 2.6 * panels + 0.8), sharex=True)
    fig.suptitle(title, fontsize=11)
    ax = axes[0]
    for key, color in (("reward", "tab:blue"), ("success", "tab:orange")):
        values = [r.get(key) for r in rows]
        style = {"color": color, "alpha": 0.35, "lw": 1, "ms": 3}
        ax.plot(steps, _floats(values), "o-", label=f"{key} (sampled)", **style)
        ax.plot(steps, running_mean(values), color=color, lw=2.2, label=f"{key}, running mean")
    end = steps[-1] + 1 if len(steps) else 1.0
    for x, evaluation, label in ((0.0, before, "before"), (end, after, "after")):
        if evaluation is not None and evaluation.get("success") is not None:
            value = evaluation["success"]
            ax.plot([x], [value], "D", color="black", ms=8)
            side = (
                {"xytext": (4, 6), "ha": "left"} if x == 0 else {"xytext": (-4, 6), "ha": "right"}
            )
            ax.annotate(f"greedy success {label}: {value:.2f}", (x, value), fontsize=8,
                        textcoords="offset points", **side)  # fmt: skip
    ax.set_ylabel("reward / success rate", fontsize=9)
    ax.set_title("reward and success (black: greedy success on held-out questions)", fontsize=10)
    ax.legend(fontsize=7, loc="upper left")
    panel = 1
    if has_kl:
        kl = [r.get("kl") for r in rows]
        axes[panel].plot(steps, _floats(kl), ".-", color="tab:purple")
        axes[panel].set_title("KL to the reference model", fontsize=10)
        axes[panel].set_ylabel("nats / token", fontsize=9)
        panel += 1
    if has_update:  # what every GRPO user watches: entropy, clipping, the step's KL
        ax = axes[panel]
        ax.plot(steps, _floats([r.get("entropy") for r in rows]), ".-", color="tab:green",
                label="entropy (nats/token)")  # fmt: skip
        ax.set_ylabel("entropy", fontsize=9)
        right = ax.twinx()
        for key, color in (("clip_fraction", "tab:red"), ("approx_kl", "tab:brown")):
            right.plot(steps, _floats([r.get(key) for r in rows]), ".--", color=color, label=key)
        right.set_ylabel("clip fraction / approx KL", fontsize=9)
        ax.set_title("the update: policy entropy, clipped share, KL old → new", fontsize=10)
        handles = ax.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
        ax.legend(handles=handles, fontsize=7, loc="upper right")
        panel += 1
    lengths = _floats([r.get("response_tokens") for r in rows])
    axes[panel].plot(steps, lengths, ".-", color="tab:gray")
    axes[panel].set_title("response length", fontsize=10)
    axes[panel].set_ylabel("tokens (mean)", fontsize=9)
    if moved:
        axes[panel + 1].step(steps, _floats(levels), where="post")
        axes[panel + 1].set_title("curriculum level", fontsize=10)
        axes[panel + 1].set_ylabel("level", fontsize=9)
        axes[panel + 1].yaxis.get_major_locator().set_params(integer=True)
    axes[-1].set_xlabel("iteration")
    _save(fig, path)


def plot_comparison(rows: Sequence[dict[str, Any]], metric: str, path: Path, title: str) -> None:
    """A run's ``metric`` per iteration (``rows`` of ``llm_gym.run.learning.compare_run``)
    over a learning card's mean and band."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    x = [row["iteration"] for row in rows]
    ax.fill_between(x, [r["low"] for r in rows], [r["high"] for r in rows], alpha=0.25,
                    color="tab:blue", label="the card's band")  # fmt: skip
    ax.plot(x, [r["mean"] for r in rows], color="tab:blue", label="the card's mean")
    ax.plot(x, [r["run"] for r in rows], color="tab:orange", marker="o", label="this run")
    ax.set(xlabel="iteration", ylabel=metric, title=title)
    ax.legend()
    _save(fig, path)


def _save(fig: Any, path: Path) -> None:
    # Written aside and renamed: a full disk leaves no half a PNG (write_file).
    try:
        fig.tight_layout()
        write_file(path, lambda aside: fig.savefig(aside, dpi=100))
    finally:
        _pyplot().close(fig)
