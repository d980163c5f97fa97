"""``Toolbox``: an env's tools by name, how calls are read, and running them safely."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

from llm_gym.checks import check_choice, check_int
from llm_gym.tools.base import Tool, ToolError, check_arguments, truncate_output
from llm_gym.tools.calls import TOOL_FORMATS, ToolCall, parse_tool_calls, tools_system_prompt
from llm_gym.tools.interpreter import PythonInterpreter
from llm_gym.tools.mcp_client import MCPTools

__all__ = ["Toolbox", "ToolRecord", "ToolSpec", "MAX_OUTPUT_CHARS"]

MAX_OUTPUT_CHARS = 4000  # of a tool message, and of each record's output in info
_SURROGATES = re.compile("[\ud800-\udfff]")
# What ``Toolbox(tools=...)`` takes: see ``Toolbox``.
ToolSpec = str | Callable[..., Any] | Tool | PythonInterpreter | MCPTools


@dataclass(frozen=True)
class ToolRecord:
    """One call as it ran: what ``info["tool_calls"]`` lists, and the tool message's text."""

    name: str | None
    arguments: dict[str, Any]
    ok: bool
    output: str
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        """The record as the plain dict ``info["tool_calls"]`` holds (shallow: ``asdict``
        recurses into the model's arguments, of any depth)."""
        return {field.name: getattr(self, field.name) for field in fields(self)}


class Toolbox:
    """The tools of one env (shared by its vector env's sub-envs), each given as
    docs/envs/tools.md says (``"python"``: a ``PythonInterpreter`` with its defaults). ``parse``
    reads a response's calls in ``tool_format``; ``run`` runs one, every failure the
    record's output.
    """

    def __init__(
        self,
        tools: Sequence[ToolSpec],
        tool_format: str = "hermes",
        max_output_chars: int = MAX_OUTPUT_CHARS,
    ) -> None:
        if isinstance(tools, (str, bytes)) or not isinstance(tools, Sequence):
            raise TypeError(
                f"tools must be a list, e.g. ['python'] or [my_function], got {tools!r:.80}"
            )
        self.tool_format = check_choice("tool_format", tool_format, TOOL_FORMATS)
        self.max_output_chars = check_int("max_output_chars", max_output_chars, low=1)
        self.servers: list[MCPTools] = []
        self.tools: dict[str, Tool] = {}
        for i, spec in enumerate(tools):
            for tool in self._resolve(i, spec):
                if tool.name in self.tools:
                    raise ValueError(f"tools[{i}]: a second tool named {tool.name!r}")
                self.tools[tool.name] = tool
        if tool_format == "markdown" and not {"python", "bash"} & set(self.tools):
            raise ValueError(
                "tool_format='markdown' runs ```python blocks with the 'python' tool (and "
                f"```bash blocks with 'bash'): add 'python' to tools, got {sorted(self.tools)}"
            )

    def _resolve(self, i: int, spec: Any) -> list[Tool]:
        if isinstance(spec, str):
            if spec != "python":
                raise ValueError(f"tools[{i}]: the built-in tools are ['python'], got {spec!r}")
            return [PythonInterpreter().tool]
        if isinstance(spec, PythonInterpreter):
            return [spec.tool]
        if isinstance(spec, Tool):
            return [spec]
        if isinstance(spec, MCPTools):
            self.servers.append(spec)
            return list(spec.tools)
        if callable(spec):
            try:
                return [Tool.from_function(spec)]
            except ValueError as error:
                raise ValueError(f"tools[{i}]: {error}") from None
        raise TypeError(
            f"tools[{i}] must be 'python', a function, a Tool or MCPTools, got "
            f"{type(spec).__name__}"
        )

    @property
    def schemas(self) -> list[dict[str, Any]]:
        """The tools as a chat template's ``tools=`` takes them."""
        return [tool.schema for tool in self.tools.values()]

    def system_prompt(self) -> str:
        """The block that tells the model its tools, for templates without ``tools=``."""
        return tools_system_prompt(self.schemas, self.tool_format)

    def parse(self, text: str) -> list[ToolCall]:
        """The calls in a response (empty: it is a final answer)."""
        return parse_tool_calls(text, self.tool_format, self.tools)

    def run(self, call: ToolCall) -> ToolRecord:
        """Run one call. Never raises: whatever goes wrong is the record's output, for the
        model to read (the call is the model's, of any shape)."""
        start = time.perf_counter()
        try:
            ok, output = self._run(call)
        except Exception as error:  # a check or a tool that failed on a call of odd shape
            ok, output = False, f"Error: {call.name!r:.80}: {type(error).__name__}: {error}"
        output = _valid_text(truncate_output(output, self.max_output_chars))
        seconds = time.perf_counter() - start
        arguments = call.arguments if isinstance(call.arguments, dict) else {}
        return ToolRecord(call.name, dict(arguments), ok, output, seconds)

    def _run(self, call: ToolCall) -> tuple[bool, str]:
        tool = self.tools.get(call.name) if isinstance(call.name, str) else None
        if call.error is not None:
            return False, f"Error: {call.error}"
        if tool is None:
            return False, f"Error: unknown tool {call.name!r}; the tools are {sorted(self.tools)}"
        if problem := check_arguments(tool.parameters, call.arguments):
            return False, f"Error: {call.name}: {problem}"
        try:
            result = tool.function(**call.arguments)
            return True, result if isinstance(result, str) else _json(result)
        except ToolError as error:
            return False, str(error)
        except Exception as error:  # the tool's own failure is the model's to read
            return False, f"Error: {call.name} raised {type(error).__name__}: {error}"

    @property
    def server_tools(self) -> list[str]:
        """The tools whose state lives in a server process (MCP's): what a fork of the env
        cannot copy. The others keep nothing between calls (the interpreter starts a fresh
        process each call; a function's own state is the function's)."""
        return sorted(tool.name for server in self.servers for tool in server.tools)

    def close(self) -> None:
        """Shut down the MCP servers."""
        for server in self.servers:
            server.close()


def _json(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError, RecursionError):
        return repr(value)  # a RecursionError here is run's to report


def _valid_text(text: str) -> str:
    """``text`` with each lone surrogate (``"\\ud800"`` in a call's JSON comes back so) as
    U+FFFD: the tool message must be tokenized and stored as UTF-8."""
    return _SURROGATES.sub("\ufffd", text)
