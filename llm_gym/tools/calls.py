"""How a model asks for a tool: parsing the calls in a response, and the prompt that says how.

The formats: ``"hermes"`` (default; Qwen2.5, SmolLM3, TRL), a JSON object ``{"name": ...,
"arguments": {...}}`` in ``<tool_call>...</tool_call>``; ``"markdown"`` (TorchRL), each
```` ```python ```` block a call of the ``python`` tool. A call that cannot be read (bad
JSON, no name, arguments not an object, a tag left open) is still a call whose ``error`` the
env sends back as the tool message.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from llm_gym.checks import check_choice

__all__ = ["CALL_FORMATS", "ToolCall", "parse_tool_calls", "tools_system_prompt"]

CALL_FORMATS = ("hermes", "markdown")

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
    try:
        call = json.loads(body)
    except json.JSONDecodeError as error:
        return ToolCall(
            None,
            error=f"the call is not valid JSON ({error.msg} at character {error.pos}); write "
            '{"name": "<tool>", "arguments": {...}} inside <tool_call></tool_call>',
        )
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return ToolCall(None, error='the call needs a "name": {"name": ..., "arguments": ...}')
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):  # some models encode the arguments object as a string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            pass
    if not isinstance(arguments, dict):
        return ToolCall(
            call["name"],
            error=f'"arguments" must be a JSON object, got {type(arguments).__name__}',
        )
    return ToolCall(call["name"], arguments)


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
