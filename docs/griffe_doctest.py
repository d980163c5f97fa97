"""A griffe extension for the API pages. llm_gym's docstrings are written for ``help()`` and
``pytest --doctest-modules``: doctest examples (``>>>`` lines) stand outside any fence, and a
few paragraphs end in reStructuredText's ``::`` before an indented example. Markdown would read
the first as block quotes (and their ``[...]`` output as links) and print the second's ``::``.
Each doctest example (its ``>>>`` lines and their output, up to a blank line) becomes a
``pycon`` fence, and each ``::`` example a ``python`` fence after a single colon; the
docstrings stay as written.
"""

from __future__ import annotations

from typing import Any

import griffe


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def fence_doctests(text: str) -> str:
    """``text`` with each doctest example (its ``>>>`` lines and their output) fenced."""
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.lstrip().startswith(">>>"):
            out.append(line)
            i += 1
            continue
        indent = _indent(line)
        if out and out[-1].strip():
            out.append("")
        out.append(f"{indent}```pycon")
        while i < len(lines) and lines[i].strip():
            out.append(lines[i])
            i += 1
        out.append(f"{indent}```")  # the blank line that ended the example follows
    return "\n".join(out)


def fence_literals(text: str) -> str:
    """``text`` with each ``paragraph::`` + indented block as ``paragraph:`` + a fence."""
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        out.append(line)
        i += 1
        stripped = line.rstrip()
        if not stripped.endswith("::") or not stripped[:-2].strip():
            continue
        indent = _indent(line)
        start = i
        while start < len(lines) and not lines[start].strip():
            start += 1
        if start == len(lines) or len(_indent(lines[start])) <= len(indent):
            continue  # no indented block follows: leave the line as it is
        end = start
        while end < len(lines) and (
            not lines[end].strip() or len(_indent(lines[end])) > len(indent)
        ):
            end += 1
        while not lines[end - 1].strip():
            end -= 1
        cut = len(_indent(lines[start]))
        out[-1] = stripped[:-1]
        out += ["", f"{indent}```python"]
        out += [indent + block[cut:] if block.strip() else "" for block in lines[start:end]]
        out.append(f"{indent}```")
        i = end
    return "\n".join(out)


class DoctestFences(griffe.Extension):
    """Fences the examples of every docstring griffe loads."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is None:
            return
        value = obj.docstring.value
        if "::" in value:
            value = fence_literals(value)
        if ">>>" in value:
            value = fence_doctests(value)
        obj.docstring.value = value
