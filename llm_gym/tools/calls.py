"""How a model asks for a tool: parsing the calls in a response, and the prompt that says how.

The formats: ``"hermes"`` (default; Qwen2.5, SmolLM3, TRL), a JSON object ``{"name": ...,
"arguments": {...}}`` in ``<tool_call>...</tool_call>``; ``"markdown"`` (TorchRL), each
```` ```python ```` block a call of the ``python`` tool (and, for an env with the ``bash``
tool, each ```` ```bash ```` or ```` ```sh ```` block, or one without a language, a call of
it). A call that cannot be read (bad
JSON, no name, arguments not an object, a tag left open, JSON nested deeper than
``MAX_JSON_DEPTH`` or a number too long for Python to read) is still a call whose ``error``
the env sends back as the tool message: reading a call never raises, whatever the text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from llm_gym.checks import check_choice

__all__ = [
    "TOOL_FORMATS",
    "MAX_JSON_DEPTH",
    "ToolCall",
    "chat_messages",
    "parse_tool_calls",
    "strip_tool_calls",
    "tools_system_prompt",
    "with_tools_prompt",
]

TOOL_FORMATS = ("hermes", "markdown")
# Arrays and objects a call may nest. json.loads recurses once per level (``"[" * 100000``
# raised RecursionError out of the step), and so do dataclasses.asdict, repr and most code a
# tool runs; real calls nest a few levels.
MAX_JSON_DEPTH = 32

_HERMES = re.compile(r"<tool_call>(.*?)(</tool_call>|\Z)", re.DOTALL)
_MARKDOWN = re.compile(r"```(python|py|bash|sh|shell)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)
# Where the env has a shell, a block without a language is a command too (small models write
# ``` then #!/bin/bash); elsewhere such a block stays text, and is not even matched, so that
# what it holds cannot close or hide a python block.
_MARKDOWN_SHELL = re.compile(r"```(python|py|bash|sh|shell|)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)
# A markdown block's language -> the tool that runs it and the argument its text is.
_BLOCK_TOOLS = {"python": ("python", "code"), "py": ("python", "code"),
                "bash": ("bash", "command"), "sh": ("bash", "command"),
                "shell": ("bash", "command"), "": ("bash", "command")}  # fmt: skip


@dataclass(frozen=True)
class ToolCall:
    """One call read from a response: a tool name and its arguments, or why it is unreadable."""

    name: str | None
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def parse_tool_calls(
    text: str, tool_format: str = "hermes", tools: Collection[str] = ("python",)
) -> list[ToolCall]:
    """The tool calls in ``text``, in order (none: the text is a final answer); in the
    markdown format the blocks of the ``tools`` there are (``python``, ``bash``).

    >>> parse_tool_calls('<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>')
    [ToolCall(name='add', arguments={'a': 1}, error=None)]
    >>> parse_tool_calls("<tool_call>{oops}</tool_call>")[0].error[:24]
    'the call is not valid JS'
    >>> parse_tool_calls("```python\\nprint(1)\\n```", "markdown")
    [ToolCall(name='python', arguments={'code': 'print(1)\\n'}, error=None)]
    >>> parse_tool_calls("```bash\\nls\\n```", "markdown", tools=["bash"])
    [ToolCall(name='bash', arguments={'command': 'ls\\n'}, error=None)]
    """
    if check_choice("tool_format", tool_format, TOOL_FORMATS) == "markdown":
        blocks = (_MARKDOWN_SHELL if "bash" in tools else _MARKDOWN).findall(text)
        calls = [(_BLOCK_TOOLS[language], body) for language, body in blocks]
        return [ToolCall(name, {key: body}) for (name, key), body in calls if name in tools]
    return [_hermes_call(body, closing) for body, closing in _HERMES.findall(text)]


def strip_tool_calls(
    text: str, tool_format: str = "hermes", tools: Collection[str] = ("python",)
) -> str:
    """``text`` less its complete tool-call blocks (what is left is the message's content; a
    hermes tag left open stays, as text; markdown blocks of tools not in ``tools`` too).

    >>> strip_tool_calls('Adding. <tool_call>{"name": "add"}</tool_call>')
    'Adding. '
    """
    if check_choice("tool_format", tool_format, TOOL_FORMATS) == "markdown":
        return (_MARKDOWN_SHELL if "bash" in tools else _MARKDOWN).sub(
            lambda m: "" if _BLOCK_TOOLS[m.group(1)][0] in tools else m.group(0), text
        )
    return _HERMES.sub(lambda m: "" if m.group(2) else m.group(0), text)


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


def tools_system_prompt(schemas: Sequence[dict[str, Any]], tool_format: str = "hermes") -> str:
    """The system-prompt block that lists the tools and how to call them, for chat templates
    that take no ``tools=`` (the hermes block is Qwen2.5's own wording)."""
    if tool_format == "markdown":
        names = {schema.get("function", {}).get("name") for schema in schemas}
        lines = []
        if "python" in names or not names:
            lines.append(
                "To run Python code, write it in a ```python code block. The code runs "
                "in a sandbox and what it prints comes back in a tool message."
            )
        if "bash" in names:
            lines.append(
                "To run a shell command, write it in a ```bash code block. It runs "
                "in the task's workspace and its output comes back in a tool "
                "message; the files you write stay for your next commands."
            )
        end = "When you have the result, give your final answer without a code block."
        return "# Tools\n\n" + " ".join([*lines, end])
    listing = "\n".join(json.dumps(schema, ensure_ascii=False) for schema in schemas)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{listing}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def chat_messages(messages: Sequence[object]) -> list[dict[str, str]]:
    """OpenAI-style messages (dicts or pydantic models, as the OpenAI API, verifiers and agent
    SDKs send them) as ``{"role", "content"}`` dicts: text parts joined, an assistant's tool
    calls written as hermes ``<tool_call>`` blocks (the text a policy would have written for
    them); a call is ``{"name", "arguments"}`` or OpenAI's ``{"function": {...}}``, its
    arguments an object or its JSON text.

    >>> chat_messages([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    [{'role': 'user', 'content': 'hi'}]
    >>> call = {"id": "c1", "type": "function",
    ...         "function": {"name": "add", "arguments": '{"a": 1}'}}
    >>> chat_messages([{"role": "assistant", "content": None, "tool_calls": [call]}])[0]["content"]
    '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
    """
    out = []
    for message in messages:
        data = message.model_dump() if hasattr(message, "model_dump") else dict(message)
        content = data.get("content")
        if isinstance(content, list):  # content parts: the text ones
            content = "".join(part.get("text", "") for part in content if isinstance(part, Mapping))
        text = content if isinstance(content, str) else ""
        for call in data.get("tool_calls") or ():
            call = call.model_dump() if hasattr(call, "model_dump") else call
            if isinstance(call.get("function"), Mapping):
                call = call["function"]
            arguments = call.get("arguments")
            with suppress(TypeError, ValueError):
                arguments = json.loads(arguments)
            body = json.dumps({"name": call.get("name"), "arguments": arguments})
            text += f"<tool_call>{body}</tool_call>"
        out.append({"role": str(data.get("role")), "content": text})
    return out


def with_tools_prompt(
    messages: list[dict[str, str]],
    schemas: Sequence[dict[str, Any]],
    tool_format: str = "hermes",
    system_role: str = "system",
) -> list[dict[str, str]]:
    """``messages`` with ``tools_system_prompt(schemas)`` at the end of the system message
    (a system message first if there is none), as llm_gym's tool envs list their tools;
    ``messages`` unchanged without schemas.

    >>> with_tools_prompt([{"role": "user", "content": "hi"}], [], "hermes")
    [{'role': 'user', 'content': 'hi'}]
    """
    if not schemas:
        return messages
    block = tools_system_prompt(schemas, tool_format)
    messages = list(messages)
    if messages and messages[0]["role"] == system_role:
        messages[0] = {**messages[0], "content": f"{messages[0]['content']}\n\n{block}"}
    else:
        messages.insert(0, {"role": system_role, "content": block})
    return messages
