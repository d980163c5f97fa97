"""``MCPTools``. The ``mcp`` SDK is async; an env steps synchronously, and a vector env calls
tools from several threads at once. So each ``MCPTools`` holds an anyio blocking portal (an
event loop in a thread of its own) in which the server's session lives; any thread's calls go
through it.

The SDK is used in both of its lines: 1.x (what OpenEnv's ``fastmcp`` 3 needs, so the two
co-install) and 2.x, which renamed a few things; ``_sdk`` reads either."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from functools import partial
from typing import Any

from llm_gym.checks import check_number
from llm_gym.tools.base import Tool, ToolError

__all__ = ["MCPTools"]


def _sdk_error() -> type[Exception]:
    # The SDK's request error: MCPError in 2.x, McpError in 1.x.
    import mcp

    return getattr(mcp, "MCPError", None) or mcp.McpError


def _read_timeout(seconds: float) -> object:
    # ClientSession's read timeout: seconds in 2.x, a timedelta in 1.x.
    from importlib.metadata import version

    if int(version("mcp").split(".")[0]) >= 2:
        return seconds
    from datetime import timedelta

    return timedelta(seconds=seconds)


def _field(model: object, name: str, camel: str) -> object:
    # 2.x names the SDK's model fields in snake_case (input_schema), 1.x in camelCase.
    return getattr(model, name) if hasattr(model, name) else getattr(model, camel)


class MCPTools:
    """Start the MCP server ``command`` over stdio with the official ``mcp`` SDK and list its
    tools (``tools``, one ``Tool`` each). Pass it in an env's ``tools=``; ``env.close()`` (or
    ``close()``) shuts the server down. Pickling it (as ``AsyncVectorEnv`` does) carries the
    command, and the copy starts a server of its own.

    Args:
        command: the server's command line, e.g. ``["python", "server.py"]``.
        env: extra environment variables for the server (the SDK passes only a safe few of
            the parent's: ``HOME``, ``PATH``, ``USER``, ...).
        cwd: the server's working directory.
        timeout: seconds to wait for the server to start, and for each call.
    """

    def __init__(
        self,
        command: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float = 30.0,
    ) -> None:
        from anyio.from_thread import start_blocking_portal
        from mcp import ClientSession, StdioServerParameters, stdio_client

        if (
            isinstance(command, str)
            or not isinstance(command, Sequence)
            or not command
            or not all(isinstance(part, str) for part in command)
        ):
            raise TypeError(
                "command must be a non-empty list of strings, e.g. ['python', 'server.py'], "
                f"got {command!r:.80}"
            )
        self.timeout = check_number("timeout", timeout, low=0, strict=True)
        self.command, self.env, self.cwd = list(command), dict(env or {}), cwd
        params = StdioServerParameters(
            command=self.command[0], args=self.command[1:], env=self.env or None, cwd=self.cwd
        )
        # Closing the stack ends the session, then the server, then the portal's thread.
        self._stack: ExitStack | None = ExitStack()
        try:
            self._portal = self._stack.enter_context(start_blocking_portal())
            enter = self._portal.wrap_async_context_manager
            streams = self._stack.enter_context(enter(stdio_client(params)))
            # The SDK's read timeout bounds every request: the start and each call.
            timeout = _read_timeout(self.timeout)
            session = ClientSession(*streams[:2], read_timeout_seconds=timeout)
            self._session = self._stack.enter_context(enter(session))
            self._portal.call(self._session.initialize)
            listed = self._portal.call(self._session.list_tools).tools
        except BaseException as error:
            try:
                self.close()
            except BaseException:  # a half-started 1.x session fails to close: the start's
                pass  # error is the one to report
            why = f"{type(error).__name__}: {error}"
            raise RuntimeError(f"MCP server {self.command} did not start: {why}") from None
        self.tools = [
            Tool(
                t.name,
                t.description or "",
                dict(_field(t, "input_schema", "inputSchema")),
                partial(self.call, t.name),
            )
            for t in listed
        ]

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            partial(MCPTools, env=self.env, cwd=self.cwd, timeout=self.timeout),
            (self.command,),
        )

    @property
    def running(self) -> bool:
        """Whether the server is up: True from a successful start until ``close()``."""
        return self._stack is not None

    def call(self, name: str, **arguments: object) -> str:
        """Call tool ``name``; its text output, or ``ToolError`` with the server's message."""
        sdk_error = _sdk_error()
        if not self.running:
            raise ToolError(f"the MCP server {self.command} is not running")
        try:
            result = self._portal.call(self._session.call_tool, name, arguments)
        except sdk_error as error:  # the SDK's timeout and protocol errors
            raise ToolError(
                f"the MCP tool {name!r} failed ({self.timeout:g} s limit): {error}"
            ) from None
        text = "\n".join(
            getattr(part, "text", None) or f"[{getattr(part, 'type', 'content')}]"
            for part in result.content
        )
        if _field(result, "is_error", "isError"):
            raise ToolError(text)
        return text

    def close(self) -> None:
        """Shut the server down (it closes its stdin, then the SDK stops the process)."""
        stack, self._stack = self._stack, None
        if stack is not None:
            stack.close()
