"""Any registered llm_gym env as an OpenEnv server: ``llm-gym serve ENV_ID`` (docs:
integrations.md, "OpenEnv").

The server is the ``openenv`` package's own (``HTTPEnvServer``: one env per WebSocket session,
``/health``, ``/schema``, ``/metadata``, ``/state``, ``/ws``); llm_gym adds only the env behind
it (``ServedEnv``, a Gymnasium env made with ``gym.make(env_id, **env_args)`` per session), the
action and observation models, and the limits OpenEnv's server leaves to its host:

- a reset or step that runs past ``step_timeout`` is an error reply; the session's env is
  discarded (its thread left to finish alone) and the session closed, so its slot frees;
- an idle session is closed (OpenEnv's own reaper closes the env but leaves the socket open),
  a peer that stops answering pings is dropped so its slot frees;
- a message over ``max_message_bytes`` is refused, over the WebSocket and over HTTP alike; a
  frame that is not a JSON object (binary, invalid JSON, nested past ``MAX_DEPTH``) is an
  error reply and the session goes on;
- the info keys that hold a task's reference (``REFERENCE_KEYS``) never leave the server
  unless ``reveal_answers``: the client may be the agent under evaluation;
- with ``api_key`` every route but ``/health`` wants the key;
- HTTP ``POST /step`` (which in OpenEnv steps a fresh, never-reset env) is a 409 pointing to
  ``/ws``, and ``/mcp`` a 404 (llm_gym envs speak no MCP; its sessions would escape the limits);
- ``web=True`` gives each browser session its own env, counted in ``max_sessions``.

On the wire (token-in/token-out holds across it):

- an action is ``{"text": str}`` or ``{"tokens": [int, ...]}``: the exact ids a policy
  sampled, stepped as they are;
- an observation holds the env's observation keys as they are (``history`` as a list of
  ``{"role", "content"}``, ``text``, ``tokens`` as a list of ints), plus ``terminated``,
  ``truncated`` and the step's ``info`` made JSON-safe; ``reward`` and ``done`` as OpenEnv
  sends them.

Served with OpenEnv's own client (``headers=`` carries an API key)::

    from openenv import GenericEnvClient

    with GenericEnvClient(base_url="http://127.0.0.1:8000").sync() as env:
        first = env.reset(seed=0)  # the observation of gym.make(ENV_ID).reset(seed=0)
        result = env.step({"text": "<answer>4</answer>"})
        result.reward, result.done, result.observation["info"]
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import json
import queue
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import parse_qs

import gymnasium as gym
import numpy as np
from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError

try:
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, ConcurrencyConfig, Observation, State
except ImportError as error:  # openenv is an optional dependency (the "serve" extra)
    raise ImportError(
        "llm_gym.integrations.openenv_server needs OpenEnv: pip install 'llm-gym[serve]' "
        "(or pip install openenv==0.10.0)"
    ) from error

from llm_gym.checks import check_int, check_number, check_str
from llm_gym.episodes.records import json_value
from llm_gym.servers import ThreadedServer

if TYPE_CHECKING:
    from fastapi import FastAPI

__all__ = [
    "MAX_DEPTH",
    "REFERENCE_KEYS",
    "ChatAction",
    "ChatObservation",
    "ChatState",
    "ServedEnv",
    "Server",
    "StepTimeout",
    "hide_references",
    "make_app",
]

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Message, Receive, Send], Awaitable[None]]

MAX_MESSAGE_BYTES = 1 << 20  # 1 MiB: a response of a few hundred thousand tokens
STEP_TIMEOUT = 60.0
MAX_DEPTH = 32  # a message nests 3 deep; JSON 100,000 deep would blow Python's stack
# The info keys where llm_gym's tasks put the reference: GSM8K's and reasoning-gym's, the
# products' ``answer``; MATH's ``solution``; HumanEval's ``canonical_solution`` and ``test``
# (its hidden tests); reasoning-gym's ``metadata`` (it often holds the solution's parts).
# A reset's info is the item's fields, so these are there from the first observation.
REFERENCE_KEYS = frozenset({"answer", "solution", "canonical_solution", "test", "metadata"})
# Its message is how the middleware knows to close the session after OpenEnv's error frame.
_TIMEOUT_MARK = "(--step-timeout)"
_KEY_COOKIE = "llm_gym_api_key"
_MAX_TOKEN_ID = 2**31 - 1  # every tokenizer's ids fit; int64 would overflow past 2**63


class StepTimeout(TimeoutError):
    """A reset or step ran past the served env's ``step_timeout``; its env is discarded."""


def hide_references(info: Mapping[str, Any]) -> dict[str, Any]:
    """``info`` without ``REFERENCE_KEYS``: what a served env may tell its client.

    >>> hide_references({"answer": "... #### 250", "success": False})
    {'success': False}
    """
    return {key: value for key, value in info.items() if key not in REFERENCE_KEYS}


class ChatAction(Action):
    """The assistant's turn: ``text`` (the response as text) or ``tokens`` (its sampled ids,
    stepped as they are), exactly one of them."""

    text: str | None = Field(default=None, description="the response as text")
    tokens: list[Annotated[int, Field(ge=0, le=_MAX_TOKEN_ID)]] | None = Field(
        default=None, description="the response's sampled token ids (tokens mode)"
    )

    @model_validator(mode="after")
    def _one_of(self) -> ChatAction:
        # A PydanticCustomError, not a ValueError: OpenEnv's error frame must serialize it.
        if (self.text is None) == (self.tokens is None):
            raise PydanticCustomError(
                "one_of", "give exactly one of 'text' or 'tokens', got {given}",
                {"given": "both" if self.text is not None else "neither"},
            )  # fmt: skip
        return self


class ChatObservation(Observation):
    """The env's observation keys as they are (None where the env has no such key), the
    step's end flags and its ``info`` (JSON-safe); OpenEnv adds ``reward`` and ``done``."""

    history: list[dict[str, str]] | None = None
    text: str | None = None
    tokens: list[int] | None = None
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = Field(default_factory=dict)


class ChatState(State):
    """OpenEnv's state (``episode_id``, ``step_count``) and the env id served."""

    env_id: str = ""


class _Worker:
    """A daemon thread running one env's calls in order (made, stepped and closed in one
    thread), each waited for at most ``timeout`` seconds. Python cannot stop a thread: a call
    out of time is left to finish alone, the worker is spent, and being a daemon it holds
    neither ``Server.stop`` nor the process's exit."""

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], list, threading.Event] | None]
        self._calls = queue.SimpleQueue()
        self.spent = False
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def _run(self) -> None:
        while (call := self._calls.get()) is not None:
            fn, box, done = call
            try:
                box.append((True, fn()))
            except BaseException as error:  # re-raised in the caller's thread
                box.append((False, error))
            done.set()

    def call(self, fn: Callable[[], Any], timeout: float, what: str) -> Any:
        """``fn()`` in the worker; ``StepTimeout`` when it takes over ``timeout`` seconds."""
        if self.spent:
            raise StepTimeout(f"this session's env was discarded after a call ran past the "
                              f"step timeout {_TIMEOUT_MARK}: open a new session")  # fmt: skip
        box: list[tuple[bool, Any]] = []
        done = threading.Event()
        self._calls.put((fn, box, done))
        if not done.wait(timeout):
            self.spent = True
            raise StepTimeout(
                f"{what} ran past the step timeout of {timeout:g} s {_TIMEOUT_MARK}: the "
                "session's env is discarded and the session closed; open a new one"
            )
        ok, value = box[0]
        if ok:
            return value
        raise value

    def finish(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` last (after any call still running) and end the thread."""
        self._calls.put((fn, [], threading.Event()))
        self._calls.put(None)


class ServedEnv(Environment[ChatAction, ChatObservation, ChatState]):
    """One session's env: ``gym.make(env_id, **env_args)``, its Gymnasium API spoken as
    OpenEnv's ``Environment``. ``reset(seed=S)`` gives the in-process ``reset(seed=S)``'s
    observation; a step raises where the env's ``step`` raises (OpenEnv sends it as the
    session's ``EXECUTION_ERROR``; the env is unchanged and the session goes on).

    The env lives in a thread of its own: ``gym.make``, a reset or a step that takes over
    ``step_timeout`` seconds (tools included) raises ``StepTimeout`` and the env is discarded
    (closed by its thread once the call ends). ``info`` loses ``REFERENCE_KEYS`` unless
    ``reveal_answers``."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # each session makes an env of its own

    def __init__(
        self,
        env_id: str,
        env_args: Mapping[str, object] | None = None,
        *,
        step_timeout: float = STEP_TIMEOUT,
        reveal_answers: bool = False,
    ) -> None:
        super().__init__()
        self.env_id = check_str("env_id", env_id)
        self.step_timeout = check_number("step_timeout", step_timeout, low=0, strict=True)
        self.reveal_answers = bool(reveal_answers)
        self._worker = _Worker(f"llm_gym-served-{env_id}")
        args = dict(env_args or {})
        try:
            self.env = self._worker.call(
                lambda: gym.make(env_id, **args), self.step_timeout, "gym.make"
            )
        except BaseException:
            self._worker.finish(lambda: None)
            raise
        self._state = ChatState(env_id=env_id)

    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        options: dict[str, Any] | None = None,
        **kwargs: object,
    ) -> ChatObservation:
        """Start an episode: ``env.reset(seed=seed, options=options)``."""
        obs, info = self._worker.call(
            lambda: self.env.reset(seed=seed, options=options), self.step_timeout, "reset"
        )
        self._state = ChatState(episode_id=episode_id, step_count=0, env_id=self.env_id)
        return self._observation(obs, None, False, False, info)

    def step(
        self, action: ChatAction, timeout_s: float | None = None, **kwargs: object
    ) -> ChatObservation:
        """Step the env with the action's text, or its token ids as an int64 array."""
        if action.tokens is not None:
            response: str | np.ndarray = np.asarray(action.tokens, dtype=np.int64)
        else:
            response = action.text or ""
        obs, reward, terminated, truncated, info = self._worker.call(
            lambda: self.env.step(response), self.step_timeout, "step"
        )
        self._state.step_count += 1
        return self._observation(obs, float(reward), terminated, truncated, info)

    def _observation(
        self,
        obs: Mapping[str, object],
        reward: float | None,
        terminated: bool,
        truncated: bool,
        info: Mapping[str, object],
    ) -> ChatObservation:
        fields = {key: json_value(obs[key]) for key in ("history", "text", "tokens") if key in obs}
        return ChatObservation(
            **fields,
            terminated=bool(terminated),
            truncated=bool(truncated),
            info=json_value(info if self.reveal_answers else hide_references(info)),
            reward=reward,
            done=bool(terminated or truncated),
        )

    @property
    def state(self) -> ChatState:
        """The session's episode id, steps so far and env id."""
        return self._state

    def close(self) -> None:
        """Close the env (its tools' servers, sandboxes) in its thread: now, or once a call
        out of time ends."""
        if self._worker.spent:
            self._worker.finish(self.env.close)
            return
        try:
            self._worker.call(self.env.close, self.step_timeout, "close")
        finally:
            self._worker.finish(lambda: None)


def make_app(
    env_id: str,
    env_args: Mapping[str, object] | None = None,
    *,
    max_sessions: int = 64,
    session_timeout: float | None = None,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
    step_timeout: float = STEP_TIMEOUT,
    reveal_answers: bool = False,
    api_key: str | None = None,
    web: bool = False,
) -> FastAPI | ASGIApp:
    """OpenEnv's app serving ``env_id`` (made with ``env_args``; one env is made and closed
    here first, so a bad id or argument fails now, not in the first session).

    Args:
        env_id: a registered env id (``gym.make``'s).
        env_args: keyword arguments of ``gym.make``.
        max_sessions: sessions at once (WebSocket and browser); one more gets OpenEnv's
            ``CAPACITY_REACHED``.
        session_timeout: seconds a session may stay idle before it is closed (None: never).
        max_message_bytes: the largest HTTP body a client may send (the WebSocket's limit is
            the server's: ``Server`` passes it to uvicorn).
        step_timeout: seconds a reset or step may take (tools included); one over is an
            error reply and its session is closed.
        reveal_answers: send the info keys that hold the reference (``REFERENCE_KEYS``).
        api_key: the key every route but ``/health`` wants: ``Authorization: Bearer KEY``,
            ``X-API-Key: KEY`` or ``?api_key=KEY`` (None: open).
        web: OpenEnv's web interface at ``/web``, where a person plays the env by hand, one
            env per browser session.
    """
    from fastapi import FastAPI
    from openenv.core.env_server.http_server import HTTPEnvServer

    check_str("env_id", env_id)
    max_sessions = check_int("max_sessions", max_sessions, 1)
    check_number("session_timeout", session_timeout, low=0, strict=True, optional=True)
    check_int("max_message_bytes", max_message_bytes, 1)
    check_number("step_timeout", step_timeout, low=0, strict=True)
    if api_key is not None and not check_str("api_key", api_key):
        raise ValueError("api_key must be a non-empty string or None, got ''")
    env_args = dict(env_args or {})
    factory = functools.partial(
        ServedEnv, env_id, env_args, step_timeout=step_timeout, reveal_answers=reveal_answers
    )
    factory().close()
    config = ConcurrencyConfig(max_concurrent_envs=max_sessions)
    # create_fastapi_app's two steps, keeping the server: browser sessions join its table.
    app = FastAPI(title=f"llm_gym {env_id} (OpenEnv)")
    server = HTTPEnvServer(
        factory, ChatAction, ChatObservation, concurrency_config=config, env_name=env_id,
        state_cls=ChatState,
    )  # fmt: skip
    server.register_routes(app, mode="simulation")
    if web:
        app = _mount_web(app, server, env_id, session_timeout)
    return _Limits(app, session_timeout, max_message_bytes, api_key)


class _Limits:
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
        if message["type"] == "websocket.send" and text and _TIMEOUT_MARK in text:
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


class Server(ThreadedServer):
    """``llm-gym serve``: uvicorn running ``make_app``'s app on ``host:port``; ``start()``
    returns once ``/health`` answers (``url`` is then set), ``stop()`` shuts it down (open
    sessions are closed, their envs with them; a step still running is given 2 s).

    Args:
        env_id, env_args, max_sessions, session_timeout, step_timeout: as ``make_app``'s.
        reveal_answers, api_key, web, max_message_bytes: as ``make_app``'s
            (``max_message_bytes`` also caps a WebSocket frame: a larger one closes the
            session with code 1009, not buffered).
        host: the address to bind (loopback by default).
        port: the port (0: a free one).
        ping_interval: seconds between WebSocket pings; a peer that answers none within
            ``ping_interval`` more is dropped and its slot freed (a half-open socket).
    """

    def __init__(
        self,
        env_id: str,
        env_args: Mapping[str, object] | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 8000,
        max_sessions: int = 64,
        session_timeout: float | None = None,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        step_timeout: float = STEP_TIMEOUT,
        reveal_answers: bool = False,
        api_key: str | None = None,
        ping_interval: float = 10.0,
        web: bool = False,
    ) -> None:
        check_number("ping_interval", ping_interval, low=0, strict=True)
        check_int("port", port, 0, 65535)
        app = make_app(
            env_id, env_args, max_sessions=max_sessions, session_timeout=session_timeout,
            max_message_bytes=max_message_bytes, step_timeout=step_timeout,
            reveal_answers=reveal_answers, api_key=api_key, web=web,
        )  # fmt: skip
        super().__init__(
            app, host=host, port=port, ws_max_size=max_message_bytes,
            ws_ping_interval=ping_interval, ws_ping_timeout=ping_interval,
            timeout_graceful_shutdown=2,
        )  # fmt: skip
        self.api_key = api_key


class _PageView:
    """What OpenEnv's page reads of "the env" when it is built: no drawing, no one-click
    actions (an llm_gym env's turn is free text)."""

    def render_web(self, observation: Mapping[str, Any]) -> None:
        return None

    def web_actions(self, observation: Mapping[str, Any]) -> list[tuple[str, dict]]:
        return []


class _BrowserSessions:
    """OpenEnv's web manager (what its Gradio page calls: ``reset_environment``,
    ``step_environment``, ``get_state``), one env per browser session: each page's session
    (Gradio's ``session_hash``) gets a session of OpenEnv's server, so it counts in
    ``max_sessions``; it ends when the tab closes, or after ``session_timeout`` idle."""

    def __init__(self, server: Any, metadata: Any, session_timeout: float | None) -> None:
        self.server, self.metadata, self.session_timeout = server, metadata, session_timeout
        self.action_cls, self.observation_cls, self.env = ChatAction, ChatObservation, _PageView()
        self.sessions: dict[str, str] = {}  # the page's session hash -> OpenEnv's session id
        self._reaper: asyncio.Task | None = None

    @staticmethod
    def _page() -> str:
        from gradio.context import LocalContext

        page = getattr(LocalContext.request.get(None), "session_hash", None)
        if not page:
            raise RuntimeError("no browser session: play the env in the page at /web/")
        return page

    async def _session(self, create: bool) -> tuple[str, str, ServedEnv]:
        page = self._page()
        session = self.sessions.get(page)
        env = self.server._sessions.get(session) if session else None
        if env is None:
            if not create:
                raise RuntimeError("this page's session ended (closed or idle): reset")
            session, env = await self.server._create_session()  # CAPACITY: the page says
            self.sessions[page] = session
            if self.session_timeout is not None and self._reaper is None:
                self._reaper = asyncio.create_task(self._reap(self.session_timeout))
        return page, session, env

    async def _call(self, page: str, session: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return await self.server._run_in_session_executor(session, fn, *args)
        except StepTimeout:
            await self._end(page)
            raise

    async def reset_environment(self, reset_kwargs: Mapping[str, Any] | None = None) -> dict:
        """Reset this page's env (made on its first reset)."""
        from openenv.core.env_server.serialization import serialize_observation

        page, session, env = await self._session(create=True)
        seed = (reset_kwargs or {}).get("seed")
        observation = await self._call(page, session, env.reset, seed)
        self.server._update_session_activity(session)
        return serialize_observation(observation)

    async def step_environment(self, action_data: Mapping[str, Any]) -> dict:
        """Step this page's env."""
        from openenv.core.env_server.serialization import (
            deserialize_action_with_preprocessing,
            serialize_observation,
        )

        action = deserialize_action_with_preprocessing(dict(action_data), ChatAction)
        page, session, env = await self._session(create=False)
        observation = await self._call(page, session, env.step, action)
        self.server._update_session_activity(session, increment_step=True)
        return serialize_observation(observation)

    def get_state(self) -> dict[str, Any]:
        """This page's env's state ({} before its first reset)."""
        env = self.server._sessions.get(self.sessions.get(self._page()))
        return {} if env is None else env.state.model_dump()

    async def _end(self, page: str) -> None:
        session = self.sessions.pop(page, None)
        if session is not None:
            await self.server._destroy_session(session)

    async def _reap(self, timeout: float) -> None:
        while True:
            await asyncio.sleep(min(timeout / 4, 5.0))
            now = time.time()
            for page, session in list(self.sessions.items()):
                info = self.server._session_info.get(session)
                if info is None or now - info.last_activity_at > timeout:
                    await self._end(page)


def _mount_web(app: Any, server: Any, env_id: str, session_timeout: float | None) -> Any:
    """``app`` with OpenEnv's web interface at ``/web`` (as its ``create_web_interface_app``
    builds it) over ``_BrowserSessions``, not its one shared env; its JSON routes
    (``/web/reset``, ``/web/step``, ``/ws/ui``) are left out: they have no session."""
    import gradio as gr
    from fastapi.responses import RedirectResponse
    from openenv.core.env_server.gradio_theme import OPENENV_GRADIO_CSS, OPENENV_GRADIO_THEME
    from openenv.core.env_server.gradio_ui import build_gradio_app, get_gradio_display_title
    from openenv.core.env_server.web_interface import (
        _extract_action_fields,
        _is_chat_env,
        get_quick_start_markdown,
        load_environment_metadata,
    )

    metadata = load_environment_metadata(server._env_factory, env_id)
    manager = _BrowserSessions(server, metadata, session_timeout)

    async def release() -> None:  # the page's request is in Gradio's context, as for a step
        await manager._end(manager._page())

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse(url="/web/")

    @app.get("/web", include_in_schema=False)
    async def web() -> RedirectResponse:
        return RedirectResponse(url="/web/")

    @app.get("/web/metadata")
    async def web_metadata() -> dict:
        return metadata.model_dump()

    quick_start = get_quick_start_markdown(metadata, ChatAction, ChatObservation)
    blocks = build_gradio_app(
        manager, _extract_action_fields(ChatAction), metadata, _is_chat_env(ChatAction),
        title=metadata.name, quick_start_md=quick_start,
    )  # fmt: skip
    blocks.title = get_gradio_display_title(metadata)
    with blocks:
        blocks.unload(release)
    return gr.mount_gradio_app(
        app, blocks, path="/web", theme=OPENENV_GRADIO_THEME, css=OPENENV_GRADIO_CSS
    )
