"""MkDocs hook: the command-line page shows ``llm-gym --help`` and every subcommand's help,
generated from ``llm_gym.cli.build_parser()`` at build time, and a page's
``<!-- llm-gym options CONFIG -->`` marker becomes the table of that config's options
(``llm_gym.options.options_table``), so neither can drift from the options' one
declaration."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from typing import Any

from mkdocs.exceptions import PluginError

MARKER = "<!-- llm-gym help -->"
PAGE = "cli.md"
# Where each config's table of options goes: the marker, the page that must hold it.
OPTION_TABLES = {
    "<!-- llm-gym options rollout -->": ("cli.md", "llm_gym.run.config", "RolloutConfig"),
    "<!-- llm-gym options train -->": ("training.md", "llm_gym.train.config", "GRPOConfig"),
    "<!-- llm-gym options profile -->": ("envs/cards.md", "llm_gym.run.config", "ProfileConfig"),
}
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


def option_tables(markdown: str, page: str) -> str:
    """``markdown`` with each options marker replaced by its config's table; a page that
    lost its marker is an error."""
    import importlib

    from llm_gym.options import options_table

    for marker, (home, module, name) in OPTION_TABLES.items():
        if home != page:
            continue
        if marker not in markdown:
            raise PluginError(f"{page} lost its marker {marker!r}: the options table has no place")
        config = getattr(importlib.import_module(module), name)
        markdown = markdown.replace(marker, options_table(config))
    return markdown


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    markdown = option_tables(markdown, page.file.src_uri)
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise PluginError(f"{PAGE} lost its marker {MARKER!r}: the generated help has no place")
    return markdown.replace(MARKER, cli_reference())
