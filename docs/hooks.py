"""MkDocs hook: the command-line page shows ``llm-gym --help`` and every subcommand's help,
generated from ``llm_gym.cli.build_parser()`` at build time, so it cannot drift from the
parser."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from typing import Any

from mkdocs.exceptions import PluginError

MARKER = "<!-- llm-gym help -->"
PAGE = "cli.md"
WIDTH = "100"  # argparse wraps help at $COLUMNS


def subcommands(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """``parser``'s subcommand parsers, depth first, in the order they were added."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):  # aliases share a parser
                yield sub
                yield from subcommands(sub)


def cli_reference() -> str:
    """Markdown: the help of ``llm-gym`` and of each subcommand, each under its heading."""
    from llm_gym.cli import build_parser

    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        parser = build_parser()
        parsers = [parser, *subcommands(parser)]
        return "\n".join(
            f"### `{p.prog}`\n\n```text\n{p.format_help().rstrip()}\n```\n" for p in parsers
        )
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise PluginError(f"{PAGE} lost its marker {MARKER!r}: the generated help has no place")
    return markdown.replace(MARKER, cli_reference())
