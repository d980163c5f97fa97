"""``ast.parse`` for rewards scored on several threads at once (the asynchronous driver's,
a thread pool's): CPython 3.11 and 3.12 keep the AST converter's recursion depth in
interpreter-wide state, so two parses at once can fail with ``SystemError: AST constructor
recursion depth mismatch`` (python/cpython#106905; seen here grading HumanEval on two
threads). One parse at a time; a parse of a reward's input is short."""

from __future__ import annotations

import ast
import threading

_LOCK = threading.Lock()


def parse(source: str, mode: str = "exec") -> ast.AST:
    """``ast.parse(source, mode=mode)``, one call at a time across threads.

    >>> type(parse("1 + 2", mode="eval").body).__name__
    'BinOp'
    """
    with _LOCK:
        return ast.parse(source, mode=mode)
