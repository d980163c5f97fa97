"""One signature for a single-env wrapper and its vector version."""

from __future__ import annotations

import inspect
from typing import Any

__all__ = ["single_env_arguments"]


def single_env_arguments(wrapper: type, env: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """``args``/``kwargs`` by name, as the single-env ``wrapper`` takes them (defaults filled
    in, ``**options`` flattened): a wrong argument fails as it would there."""
    signature = inspect.signature(wrapper)
    bound = signature.bind(env, *args, **kwargs)
    bound.apply_defaults()
    named = dict(bound.arguments)
    del named["env"]
    for name, parameter in signature.parameters.items():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            named.update(named.pop(name))
    return named
