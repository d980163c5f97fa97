"""Module ``__getattr__`` for packages whose names import on first use (PEP 562), so that a
light module inside them (a config) loads without torch."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """A ``__getattr__`` for ``package`` importing each name of ``exports`` (name -> module
    that defines it) when it is first looked up."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name]), name)
        setattr(sys.modules[package], name, value)  # later lookups skip this function
        return value

    return __getattr__
