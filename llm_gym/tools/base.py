"""``Tool``: a name, a JSON schema and a function, as a chat template's ``tools=`` lists it."""

from __future__ import annotations

import reprlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Tool", "ToolError", "check_arguments", "truncate_output"]

# JSON schema type -> the Python types a decoded JSON value of that type has.
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


class _ShortRepr(reprlib.Repr):
    """The model's argument in an error message: a few items, levels and 60 characters, so
    that neither a 1 MB value nor one nested 10000 deep costs more (repr recurses per level,
    and an int over 4300 digits has none)."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel, self.maxstring, self.maxother = 3, 60, 60
        self.maxlist = self.maxtuple = self.maxdict = self.maxset = 6

    def repr_int(self, x: int, level: int) -> str:
        return super().repr_int(x, level) if x.bit_length() < 4000 else "<an int too long to print>"


_REPR = _ShortRepr()


class ToolError(Exception):
    """A tool's failure whose message is meant for the model (sent as the tool message)."""


@dataclass(frozen=True)
class Tool:
    """One tool the model may call: ``function(**arguments)`` returns its output.

    ``parameters`` is a JSON schema of an object, as in OpenAI's function-calling format;
    ``schema`` is the entry a chat template's ``tools=`` takes; ``from_function`` builds one
    from a typed, documented function.
    """

    name: str
    description: str
    parameters: Mapping[str, Any]
    function: Callable[..., Any] = field(compare=False)

    @classmethod
    def from_function(cls, function: Callable[..., Any]) -> Tool:
        """A tool from a plain function with type hints and a Google-style docstring (its
        schema as ``transformers.utils.get_json_schema`` builds it)."""
        from transformers.utils import get_json_schema

        if not callable(function):
            raise TypeError(f"a tool must be callable, got {type(function).__name__}")
        try:
            spec = get_json_schema(function)["function"]
        except Exception as error:  # transformers' DocstringParsingException and TypeErrors
            raise ValueError(
                f"tool {getattr(function, '__name__', function)!r} needs type hints and a "
                f"docstring describing each argument (Args: section): {error}"
            ) from None
        return cls(spec["name"], spec.get("description", ""), spec["parameters"], function)

    @property
    def schema(self) -> dict[str, Any]:
        """``{"type": "function", "function": {name, description, parameters}}``."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": dict(self.parameters),
            },
        }


def check_arguments(parameters: Mapping[str, Any], arguments: object) -> str | None:
    """What is wrong with ``arguments`` for a tool taking ``parameters``, or None.

    Checks the top level of the schema: an object, its required keys, no unknown keys
    (unless ``additionalProperties`` allows them), each value's JSON type and enum.

    >>> params = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    >>> check_arguments(params, {"a": 1}) is None, check_arguments(params, {"a": "1"})
    (True, "argument 'a' must be integer, got str '1'")
    """
    if not isinstance(arguments, dict):
        return f"arguments must be a JSON object, got {type(arguments).__name__}"
    properties = parameters.get("properties", {}) or {}
    missing = [name for name in parameters.get("required", []) if name not in arguments]
    if missing:
        return f"missing required arguments {missing}; the tool takes {sorted(properties)}"
    if parameters.get("additionalProperties", False) is False:
        unknown = sorted(set(arguments) - set(properties))
        if unknown:
            return f"unknown arguments {unknown}; the tool takes {sorted(properties)}"
    for name, value in arguments.items():
        spec = properties.get(name, {})
        problem = _check_value(spec, value)
        if problem:
            return f"argument {name!r} {problem}"
    return None


def _check_value(spec: Mapping[str, Any], value: Any) -> str | None:
    if "enum" in spec and value not in spec["enum"]:
        return f"must be one of {spec['enum']}, got {_REPR.repr(value)}"
    kinds = spec.get("type")
    if kinds is None:
        return None
    kinds = [kinds] if isinstance(kinds, str) else list(kinds)
    if spec.get("nullable"):
        kinds.append("null")
    for kind in kinds:
        types = _JSON_TYPES.get(kind)
        if types is None:
            return None  # a type this check does not know: leave it to the tool
        if isinstance(value, bool) and kind != "boolean":
            continue  # JSON's true is no number, though Python's bool is an int
        if isinstance(value, types):
            return None
    return f"must be {' or '.join(kinds)}, got {type(value).__name__} {_REPR.repr(value)}"


def truncate_output(text: str, limit: int) -> str:
    """``text`` cut to about ``limit`` characters, keeping its start and its end (where a
    traceback says what went wrong).

    >>> truncate_output("a" * 10 + "b" * 10, 8)
    'aaaa\\n[... 12 characters cut ...]\\nbbbb'
    """
    if len(text) <= limit:
        return text
    head = limit // 2
    tail = limit - head
    return (
        f"{text[:head]}\n[... {len(text) - limit} characters cut ...]\n{text[len(text) - tail :]}"
    )
