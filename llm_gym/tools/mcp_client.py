"""``MCPTools``: the tools of an MCP server, started from a command line and spoken to over
stdio with the official ``mcp`` SDK.

The SDK is async; an env steps synchronously, and a vector env calls tools from several
threads at once. So each ``MCPTools`` runs one event loop in a background thread that owns
the server's session for its whole life; calls from any thread are submitted to it and wait
for their result.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from functools import partial
from typing import Any

from llm_gym.tools.base import Tool, ToolError

__all__ = ["MCPTools"]


class MCPTools:
    """Start the MCP server ``command`` and list its tools (``tools``, one ``Tool`` each).

    Pass it in an env's ``tools=``; ``env.close()`` (or ``close()``) shuts the server down.
    Pickling it (as ``AsyncVectorEnv`` does) carries the command, and the copy starts a
    server of its own.

    Arguments:

    - ``command``: the server's command line, e.g. ``["python", "server.py"]``.
    - ``env``: extra environment variables for the server (the SDK passes only a safe few of
      the parent's: ``HOME``, ``PATH``, ``USER``, ...).
    - ``cwd``: the server's working directory.
    - ``timeout``: seconds to wait for the server to start, and for each call.
    """

    def __init__(
        self,
        command: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float = 30.0,
    ) -> None:
        if isinstance(command, str) or not isinstance(command, Sequence) or not command:
            raise TypeError(
                "command must be a non-empty list of strings, e.g. ['python', 'server.py'], "
                f"got {command!r:.80}"
            )
        if not all(isinstance(part, str) for part in command):
            raise TypeError(f"command must hold only strings, got {command!r:.80}")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ValueError(f"timeout must be a number of seconds > 0, got {timeout!r}")
        self.command, self.env, self.cwd = list(command), dict(env or {}), cwd
        self.timeout = float(timeout)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._session: Any = None
        self._stop: asyncio.Event | None = None
        self._ready: Future = Future()
        self._served = asyncio.run_coroutine_threadsafe(self._serve(), self._loop)
        try:
            listed = self._ready.result(timeout=self.timeout)
        except BaseException as error:
            self.close()
            raise RuntimeError(f"MCP server {self.command} did not start: {error}") from None
        self.tools = [
            Tool(t.name, t.description or "", dict(t.input_schema), partial(self.call, t.name))
            for t in listed
        ]

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restart, (self.command, self.env, self.cwd, self.timeout))

    async def _serve(self) -> None:
        from mcp import ClientSession, StdioServerParameters, stdio_client

        params = StdioServerParameters(
            command=self.command[0], args=self.command[1:], env=self.env or None, cwd=self.cwd
        )
        self._stop = asyncio.Event()
        try:
            async with stdio_client(params) as streams, ClientSession(*streams[:2]) as session:
                await session.initialize()
                listed = (await session.list_tools()).tools
                self._session = session
                self._ready.set_result(listed)
                await self._stop.wait()
        except BaseException as error:
            if not self._ready.done():
                self._ready.set_exception(error)
            else:
                raise
        finally:
            self._session = None

    def call(self, name: str, **arguments: Any) -> str:
        """Call tool ``name``; its text output, or ``ToolError`` with the server's message."""
        if self._session is None:
            raise ToolError(f"the MCP server {self.command} is not running")
        future = asyncio.run_coroutine_threadsafe(
            self._session.call_tool(name, arguments), self._loop
        )
        try:
            result = future.result(timeout=self.timeout)
        except TimeoutError:
            future.cancel()
            raise ToolError(
                f"the MCP tool {name!r} gave no result within {self.timeout:g} s"
            ) from None
        text = "\n".join(
            getattr(part, "text", None) or f"[{getattr(part, 'type', 'content')}]"
            for part in result.content
        )
        if result.is_error:
            raise ToolError(text)
        return text

    def close(self) -> None:
        """Shut the server down (it closes its stdin, then the SDK stops the process)."""
        if not self._thread.is_alive():
            return
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        try:
            self._served.result(timeout=self.timeout)
        except BaseException:  # a server that failed to start already said why
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=self.timeout)
        if not self._thread.is_alive():
            self._loop.close()


def _restart(command: list[str], env: dict[str, str], cwd: str | None, timeout: float) -> MCPTools:
    return MCPTools(command, env=env, cwd=cwd, timeout=timeout)
