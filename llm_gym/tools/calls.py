"""How a model asks for a tool: parsing the calls in a response, and the prompt that says how.

The formats: ``"hermes"`` (default; Qwen2.5, SmolLM3, TRL), a JSON object ``{"name": ...,
"arguments": {...}}`` in ``<tool_call>...</tool_call>``; ``"markdown"`` (TorchRL), each
```` ```python ```` block a call of the ``python`` tool. A call that cannot be read (bad
JSON, no name, arguments not an object, a tag left open, JSON nested deeper than
``MAX_JSON_DEPTH`` or a number too long for Python to read) is still a call whose ``error``
the env sends back as the tool message: reading a call never raises, whatever the text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from llm_gym.checks import check_choice

__all__ = ["CALL_FORMATS", "MAX_JSON_DEPTH", "ToolCall", "parse_tool_calls", "tools_system_prompt"]

CALL_FORMATS = ("hermes", "markdown")
# Arrays and objects a call may nest. json.loads recurses once per level (``"[" * 100000``
# raised RecursionError out of the step), and so do dataclasses.asdict, repr and most code a
# tool runs; real calls nest a few levels.
MAX_JSON_DEPTH = 32

_HERMES = re.compile(r"<tool_call>(.*?)(</tool_call>|\Z)", re.DOTALL)
_MARKDOWN = re.compile(r"```(?:python|py)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    """One call read from a response: a tool name and its arguments, or why it is unreadable."""

    name: str | None
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def parse_tool_calls(text: str, call_format: str = "hermes") -> list[ToolCall]:
    """The tool calls in ``text``, in order (none: the text is a final answer).

    >>> parse_tool_calls('<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>')
    [ToolCall(name='add', arguments={'a': 1}, error=None)]
    >>> parse_tool_calls("<tool_call>{oops}</tool_call>")[0].error[:24]
    'the call is not valid JS'
    >>> parse_tool_calls("```python\\nprint(1)\\n```", "markdown")
    [ToolCall(name='python', arguments={'code': 'print(1)\\n'}, error=None)]
    """
    if check_choice("call_format", call_format, CALL_FORMATS) == "markdown":
        return [ToolCall("python", {"code": code}) for code in _MARKDOWN.findall(text)]
    return [_hermes_call(body, closing) for body, closing in _HERMES.findall(text)]


def _hermes_call(body: str, closing: str) -> ToolCall:
    if not closing:
        return ToolCall(None, error="the <tool_call> tag is not closed with </tool_call>")
    call, problem = _loads(body)
    if problem is not None:
        return ToolCall(
            None,
            error=f"the call is not valid JSON ({problem}); write "
            '{"name": "<tool>", "arguments": {...}} inside <tool_call></tool_call>',
        )
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return ToolCall(None, error='the call needs a "name": {"name": ..., "arguments": ...}')
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):  # some models encode the arguments object as a string
        decoded, problem = _loads(arguments)
        if problem is not None:
            return ToolCall(
                call["name"], error=f'"arguments" must be a JSON object, got str ({problem})'
            )
        arguments = decoded
    if not isinstance(arguments, dict):
        return ToolCall(
            call["name"],
            error=f'"arguments" must be a JSON object, got {type(arguments).__name__}',
        )
    return ToolCall(call["name"], arguments)


def _loads(text: str) -> tuple[Any, str | None]:
    """``json.loads(text)`` and None, or None and why it cannot be read. Never raises: the text
    is the model's."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        return None, f"{error.msg} at character {error.pos}"
    except RecursionError:  # deeper than the interpreter's stack: over MAX_JSON_DEPTH anyway
        return None, f"arrays and objects nested more than {MAX_JSON_DEPTH} deep"
    except ValueError as error:  # e.g. an integer over Python's 4300-digit limit
        return None, str(error).split(";")[0]
    if _too_deep(value):
        return None, f"arrays and objects nested more than {MAX_JSON_DEPTH} deep"
    return value, None


def _too_deep(value: Any) -> bool:
    # Without recursion: this guards the code that recurses.
    stack = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        for child in children:
            if isinstance(child, (dict, list)):
                if depth >= MAX_JSON_DEPTH:
                    return True
                stack.append((child, depth + 1))
    return False


def tools_system_prompt(schemas: Sequence[dict[str, Any]], call_format: str = "hermes") -> str:
    """The system-prompt block that lists the tools and how to call them, for chat templates
    that take no ``tools=`` (the hermes block is Qwen2.5's own wording)."""
    if call_format == "markdown":
        return (
            "# Tools\n\nTo run Python code, write it in a ```python code block. The code runs "
            "in a sandbox and what it prints comes back in a tool message. When you have the "
            "result, give your final answer without a code block."
        )
    listing = "\n".join(json.dumps(schema, ensure_ascii=False) for schema in schemas)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{listing}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )
