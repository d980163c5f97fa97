"""The gate in front of a served env's OpenEnv app (``llm_gym.integrations.openenv_server``):
ASGI middleware for what OpenEnv's server leaves to its host — the API key, the frames its
session loop cannot take (answered, the session going on), a session closed after a step out
of time or when idle, HTTP bodies bounded, and the routes that have no session refused."""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qs

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Message, Receive, Send], Awaitable[None]]

MAX_DEPTH = 32  # a message nests 3 deep; JSON 100,000 deep would blow Python's stack
# In the message of a step out of time: how the gate knows to close the session after
# OpenEnv's error frame.
TIMEOUT_MARK = "(--step-timeout)"
_KEY_COOKIE = "llm_gym_api_key"


class StepTimeout(TimeoutError):
    """A reset or step ran past the served env's ``step_timeout``; its env is discarded."""


class Gate:
    """ASGI middleware: the API key, the frames OpenEnv's session loop cannot take (answered
    in its error frame, the session going on), the session closed after a step out of time or
    idle for ``session_timeout`` seconds, an HTTP body over ``max_bytes`` refused, and the
    routes with no session of their own refused."""

    def __init__(
        self, app: ASGIApp, session_timeout: float | None, max_bytes: int, api_key: str | None
    ) -> None:
        self.app, self.session_timeout, self.max_bytes = app, session_timeout, max_bytes
        self.api_key = api_key

    def __getattr__(self, name: str) -> object:  # the FastAPI app's routes, state, ...
        return getattr(self.app, name)

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):  # lifespan
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        if self.api_key is not None and path != "/health" and not self._allowed(scope):
            await _deny(scope, receive, send)
            return
        if scope["type"] == "http":
            length = dict(scope.get("headers") or []).get(b"content-length")
            if length is not None and int(length) > self.max_bytes:
                detail = f"request body of {int(length)} bytes is over the {self.max_bytes} limit"
                await _reply(scope, receive, send, 413, detail)
                return
        refusal = _REFUSED.get(path.rstrip("/") or "/")
        if refusal is not None and (scope["type"] == "websocket" or scope["method"] == "POST"):
            await _reply(scope, receive, send, *refusal)
            return
        if scope["type"] == "websocket":
            if path == "/ws":
                state = _Session()
                receive = self._frames(receive, send, state)
                send = _closing_after_timeout(send, state)
        else:
            receive = self._bounded(receive)
            send = _with_key_cookie(scope, send) if self.api_key is not None else send
        await self.app(scope, receive, send)

    def _allowed(self, scope: Message) -> bool:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        given = [headers.get("x-api-key", "")]
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer":
            given.append(token.strip())
        given += parse_qs(scope.get("query_string", b"").decode("latin-1")).get("api_key", [])
        for part in headers.get("cookie", "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == _KEY_COOKIE:
                given.append(value)
        key = self.api_key.encode()
        return any(hmac.compare_digest(g.encode(), key) for g in given if g)

    def _frames(self, receive: Receive, send: Send, state: _Session) -> Receive:
        """The client's frames as OpenEnv's loop reads them: a frame it cannot take is
        answered here and the next one read; after the session's end (idle, a step out of
        time) a disconnect."""
        timeout, connected = self.session_timeout, False

        async def frames() -> Message:
            nonlocal connected
            if not connected:  # the handshake comes first, whenever the client sends it
                connected = True
                return await receive()
            while True:
                if state.closed:
                    return {"type": "websocket.disconnect", "code": 1011}
                try:
                    message = await asyncio.wait_for(receive(), timeout)
                except asyncio.TimeoutError:
                    text = f"session closed after {timeout:g} s idle (--session-timeout)"
                    await _error_frame(send, text, "SESSION_ERROR")
                    await send({"type": "websocket.close", "code": 1001, "reason": "idle"})
                    return {"type": "websocket.disconnect", "code": 1001}
                if message["type"] != "websocket.receive":
                    return message
                problem = _frame_problem(message)
                if problem is None:
                    return message
                await _error_frame(send, *problem)

        return frames

    def _bounded(self, receive: Receive) -> Receive:
        # A body without a content-length (chunked) is counted as it arrives.
        seen, limit = 0, self.max_bytes

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > limit:
                raise ValueError(f"request body over {limit} bytes")
            return message

        return counted


class _Session:
    """One WebSocket's state as the middleware sees it."""

    closed = False


def _closing_after_timeout(send: Send, state: _Session) -> Send:
    """``send``, closing the socket after OpenEnv's error frame for a call out of time (the
    session loop then reads a disconnect and destroys the session, freeing its slot)."""

    async def sending(message: Message) -> None:
        await send(message)
        text = message.get("text")
        if message["type"] == "websocket.send" and text and TIMEOUT_MARK in text:
            frame = json.loads(text)
            data = frame.get("data") if isinstance(frame, dict) else None
            if (frame.get("type") == "error" and isinstance(data, dict)
                    and data.get("code") == "EXECUTION_ERROR"):  # fmt: skip
                state.closed = True
                await send({"type": "websocket.close", "code": 1011, "reason": "step timeout"})

    return sending


def _frame_problem(message: Message) -> tuple[str, str] | None:
    """Why OpenEnv's loop cannot take this frame (its message and error code), or None."""
    text = message.get("text")
    if text is None:
        return "a binary frame: send each message as JSON in a text frame", "INVALID_JSON"
    try:
        value = json.loads(text)
    except RecursionError:
        return f"invalid JSON: nested over {MAX_DEPTH} deep", "INVALID_JSON"
    except ValueError as error:
        return f"invalid JSON: {error}", "INVALID_JSON"
    if not isinstance(value, dict):
        kind = "null" if value is None else type(value).__name__
        return (f'a message must be a JSON object {{"type": ..., "data": ...}}, got {kind}',
                "VALIDATION_ERROR")  # fmt: skip
    if _deeper_than(value, MAX_DEPTH):
        return f"a message may nest at most {MAX_DEPTH} deep", "VALIDATION_ERROR"
    return None


def _deeper_than(value: object, limit: int) -> bool:
    """Whether ``value`` nests lists/dicts deeper than ``limit`` (iterative: no recursion).

    >>> _deeper_than({"a": [[1]]}, 3), _deeper_than({"a": [[1]]}, 2)
    (False, True)
    """
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return False


async def _error_frame(send: Send, message: str, code: str) -> None:
    frame = json.dumps({"type": "error", "data": {"message": message, "code": code}})
    await send({"type": "websocket.send", "text": frame})


# Routes refused with (status, why): OpenEnv gives each HTTP call a fresh env, so /step
# steps an env never reset; /mcp's HTTP sessions escape the WebSocket's limits; the web
# interface's JSON routes share one env among all callers (the page itself plays per
# browser session).
_USE_WS = "play an episode over the WebSocket at /ws (OpenEnv's client does)"
_REFUSED: dict[str, tuple[int, str]] = {
    "/step": (409, f"HTTP /step has no session: each HTTP call gets a fresh env; {_USE_WS}"),
    "/mcp": (404, "this server speaks no MCP (an llm_gym env has no MCP tools to list)"),
    "/web/reset": (409, f"/web/reset has no session of its own: play at /web/ or {_USE_WS}"),
    "/web/step": (409, f"/web/step has no session of its own: play at /web/ or {_USE_WS}"),
    "/ws/ui": (404, "no shared web state here: each browser session plays its own env"),
}


async def _reply(scope: Message, receive: Receive, send: Send, status: int, why: str) -> None:
    """An HTTP error reply (``{"detail": why}``), or a WebSocket refused before it opens."""
    if scope["type"] == "websocket":
        await receive()  # websocket.connect
        await send({"type": "websocket.close", "code": 1008, "reason": why[:120]})
        return
    headers = [(b"content-type", b"application/json")]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": json.dumps({"detail": why}).encode()})


async def _deny(scope: Message, receive: Receive, send: Send) -> None:
    why = ("missing or wrong API key: send 'Authorization: Bearer KEY' or 'X-API-Key: KEY' "
           "(a browser: open /web/?api_key=KEY once)")  # fmt: skip
    await _reply(scope, receive, send, 401, why)


def _with_key_cookie(scope: Message, send: Send) -> Send:
    """``send``, setting the key's cookie when the request carried ``?api_key=``: a browser
    opens ``/web/?api_key=KEY`` once and its page's own requests then carry the key."""
    keys = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("api_key")
    if not keys:
        return send
    cookie = f"{_KEY_COOKIE}={keys[0]}; Path=/; HttpOnly; SameSite=Strict".encode("latin-1")

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), (b"set-cookie", cookie)]}
        await send(message)

    return sending
