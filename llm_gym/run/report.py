"""A run's ``report.md``: its title, its numbers as a table, notes, and its plots embedded, so
a run folder opens as one page (on GitHub, in an editor's preview, or as plain text)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from llm_gym.run.files import write_text

__all__ = ["REPORT_FILE", "write_report"]

REPORT_FILE = "report.md"


def _cell(value: Any) -> str:
    """A table cell: None as n/a, floats to four significant digits, ``|`` escaped."""
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "\\|")


def write_report(
    out: str | os.PathLike[str],
    title: str,
    summary_rows: Mapping[str, Any] | Sequence[tuple[str, Any]],
    images: Sequence[str | os.PathLike[str]],
    notes: Sequence[str] = (),
) -> Path:
    """Write ``out/report.md``: ``title``, the ``summary_rows`` (name → value) as a table,
    each of ``notes`` as a line, then each of ``images`` embedded by its path relative to
    ``out`` (so the folder can be moved), whole or not at all (``write_text``); its path.

    >>> import tempfile
    >>> path = write_report(tempfile.mkdtemp(), "run", {"success": 0.25}, [])
    >>> print(path.read_text())
    # run
    <BLANKLINE>
    | metric | value |
    | --- | --- |
    | success | 0.25 |
    <BLANKLINE>
    """
    folder = Path(out)
    rows = list(summary_rows.items() if isinstance(summary_rows, Mapping) else summary_rows)
    lines = [f"# {title}", "", "| metric | value |", "| --- | --- |"]
    lines += [f"| {_cell(name)} | {_cell(value)} |" for name, value in rows]
    lines.append("")
    if notes:
        lines += [*(f"{note}  " for note in notes), ""]
    for image in images:
        relative = Path(os.path.relpath(Path(image), folder)).as_posix()
        lines += [f"![{Path(image).stem}]({relative})", ""]
    return write_text(folder / REPORT_FILE, "\n".join(lines))
