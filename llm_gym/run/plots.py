"""The curves a run draws: one panel per metric, with a running mean, as a PNG."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["plot_curves"]


def plot_curves(
    rows: list[dict[str, Any]], names: Sequence[str], path: Path, x: str, window: int = 5
) -> None:
    """One panel per name in ``names`` that ``rows`` hold (None: no point) over ``x``, with the
    running mean over ``window`` rows (batches are small: the trend is in the mean)."""
    import matplotlib

    matplotlib.use("Agg")  # no display: write the file only
    import matplotlib.pyplot as plt

    names = [n for n in names if any(r.get(n) is not None for r in rows)] or list(names[:1])
    fig, axes = plt.subplots(len(names), 1, figsize=(7, 1.8 * len(names) + 0.6), sharex=True)
    axes = np.atleast_1d(axes)
    steps = [r[x] for r in rows]
    for ax, name in zip(axes, names, strict=True):
        values = np.array([np.nan if r.get(name) is None else r[name] for r in rows], float)
        ax.plot(steps, values, ".", alpha=0.6)
        if len(values) >= window:
            ax.plot(steps[window - 1 :], np.convolve(values, np.ones(window) / window, "valid"))
        ax.set_ylabel(name.replace("_", " "), fontsize=8)
    axes[-1].set_xlabel(x)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
