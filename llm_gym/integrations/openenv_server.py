"""Any registered llm_gym env as an OpenEnv server: ``llm-gym serve ENV_ID`` (docs:
integrations.md, "OpenEnv").

The server is the ``openenv`` package's own (``create_app``: one env per WebSocket session,
``/health``, ``/schema``, ``/metadata``, ``/state``, ``/ws``); llm_gym adds only the env behind
it (``ServedEnv``, a Gymnasium env made with ``gym.make(env_id, **env_args)`` per session), the
action and observation models, and the limits OpenEnv's server leaves to its host: an idle
session is closed (OpenEnv's own reaper closes the env but leaves the socket open), a peer that
stops answering pings is dropped so its slot frees, and a message over ``max_message_bytes`` is
refused, over the WebSocket and over HTTP alike.

On the wire (token-in/token-out holds across it):

- an action is ``{"text": str}`` or ``{"tokens": [int, ...]}``: the exact ids a policy
  sampled, stepped as they are;
- an observation holds the env's observation keys as they are (``history`` as a list of
  ``{"role", "content"}``, ``text``, ``tokens`` as a list of ints), plus ``terminated``,
  ``truncated`` and the step's ``info`` made JSON-safe; ``reward`` and ``done`` as OpenEnv
  sends them.

Served with OpenEnv's own client::

    from openenv import GenericEnvClient

    with GenericEnvClient(base_url="http://127.0.0.1:8000").sync() as env:
        first = env.reset(seed=0)  # the observation of gym.make(ENV_ID).reset(seed=0)
        result = env.step({"text": "<answer>4</answer>"})
        result.reward, result.done, result.observation["info"]
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Annotated, Any

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
    "ChatAction",
    "ChatObservation",
    "ChatState",
    "ServedEnv",
    "Server",
    "make_app",
]

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Message, Receive, Send], Awaitable[None]]

MAX_MESSAGE_BYTES = 1 << 20  # 1 MiB: a response of a few hundred thousand tokens


class ChatAction(Action):
    """The assistant's turn: ``text`` (the response as text) or ``tokens`` (its sampled ids,
    stepped as they are), exactly one of them."""

    text: str | None = Field(default=None, description="the response as text")
    tokens: list[Annotated[int, Field(ge=0)]] | None = Field(
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


class ServedEnv(Environment[ChatAction, ChatObservation, ChatState]):
    """One session's env: ``gym.make(env_id, **env_args)``, its Gymnasium API spoken as
    OpenEnv's ``Environment``. ``reset(seed=S)`` gives the in-process ``reset(seed=S)``'s
    observation; a step raises where the env's ``step`` raises (OpenEnv sends it as the
    session's ``EXECUTION_ERROR``; the env is unchanged and the session goes on)."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # each session makes an env of its own

    def __init__(self, env_id: str, env_args: Mapping[str, object] | None = None) -> None:
        super().__init__()
        self.env_id = check_str("env_id", env_id)
        self.env = gym.make(env_id, **dict(env_args or {}))
        self._state = ChatState(env_id=env_id)

    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        options: dict[str, Any] | None = None,
        **kwargs: object,
    ) -> ChatObservation:
        """Start an episode: ``env.reset(seed=seed, options=options)``."""
        obs, info = self.env.reset(seed=seed, options=options)
        self._state = ChatState(episode_id=episode_id, step_count=0, env_id=self.env_id)
        return _observation(obs, None, False, False, info)

    def step(
        self, action: ChatAction, timeout_s: float | None = None, **kwargs: object
    ) -> ChatObservation:
        """Step the env with the action's text, or its token ids as an int64 array."""
        if action.tokens is not None:
            response: str | np.ndarray = np.asarray(action.tokens, dtype=np.int64)
        else:
            response = action.text or ""
        obs, reward, terminated, truncated, info = self.env.step(response)
        self._state.step_count += 1
        return _observation(obs, float(reward), terminated, truncated, info)

    @property
    def state(self) -> ChatState:
        """The session's episode id, steps so far and env id."""
        return self._state

    def close(self) -> None:
        """Close the env (its tools' servers, sandboxes)."""
        self.env.close()


def _observation(
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
        info=json_value(info),
        reward=reward,
        done=bool(terminated or truncated),
    )


def make_app(
    env_id: str,
    env_args: Mapping[str, object] | None = None,
    *,
    max_sessions: int = 64,
    session_timeout: float | None = None,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
    web: bool = False,
) -> FastAPI | ASGIApp:
    """OpenEnv's app serving ``env_id`` (made with ``env_args``; one env is made and closed
    here first, so a bad id or argument fails now, not in the first session).

    Args:
        env_id: a registered env id (``gym.make``'s).
        env_args: keyword arguments of ``gym.make``.
        max_sessions: WebSocket sessions at once; one more gets OpenEnv's ``CAPACITY_REACHED``.
        session_timeout: seconds a session may stay idle before it is closed (None: never).
        max_message_bytes: the largest HTTP body a client may send (the WebSocket's limit is
            the server's: ``Server`` passes it to uvicorn).
        web: OpenEnv's web interface at ``/web``, where a person plays the env by hand.
    """
    from openenv.core.env_server.http_server import create_fastapi_app
    from openenv.core.env_server.web_interface import create_web_interface_app

    check_str("env_id", env_id)
    max_sessions = check_int("max_sessions", max_sessions, 1)
    check_number("session_timeout", session_timeout, low=0, strict=True, optional=True)
    check_int("max_message_bytes", max_message_bytes, 1)
    env_args = dict(env_args or {})
    ServedEnv(env_id, env_args).close()
    factory = functools.partial(ServedEnv, env_id, env_args)
    config = ConcurrencyConfig(max_concurrent_envs=max_sessions)
    make = create_web_interface_app if web else create_fastapi_app
    app = make(
        factory, ChatAction, ChatObservation, env_name=env_id, concurrency_config=config,
        state_cls=ChatState,
    )  # fmt: skip
    return _Limits(app, session_timeout, max_message_bytes)


class _Limits:
    """ASGI middleware: closes a WebSocket idle for ``session_timeout`` seconds (telling the
    client why, in OpenEnv's error frame) and refuses an HTTP body over ``max_bytes``."""

    def __init__(self, app: ASGIApp, session_timeout: float | None, max_bytes: int) -> None:
        self.app, self.session_timeout, self.max_bytes = app, session_timeout, max_bytes

    def __getattr__(self, name: str) -> object:  # the FastAPI app's routes, state, ...
        return getattr(self.app, name)

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket" and self.session_timeout is not None:
            receive = self._idle_closing(receive, send)
        elif scope["type"] == "http":
            length = dict(scope.get("headers") or []).get(b"content-length")
            if length is not None and int(length) > self.max_bytes:
                await _refuse(send, self.max_bytes, int(length))
                return
            receive = self._bounded(receive)
        await self.app(scope, receive, send)

    def _idle_closing(self, receive: Receive, send: Send) -> Receive:
        timeout, connected = self.session_timeout, False

        async def timed() -> Message:
            nonlocal connected
            if not connected:  # the handshake comes first, whenever the client sends it
                connected = True
                return await receive()
            try:
                return await asyncio.wait_for(receive(), timeout)
            except asyncio.TimeoutError:
                error = {"message": f"session closed after {timeout:g} s idle (--session-timeout)",
                         "code": "SESSION_ERROR"}  # fmt: skip
                frame = json.dumps({"type": "error", "data": error})
                await send({"type": "websocket.send", "text": frame})
                await send({"type": "websocket.close", "code": 1001, "reason": "idle"})
                return {"type": "websocket.disconnect", "code": 1001}

        return timed

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


async def _refuse(send: Send, limit: int, length: int) -> None:
    body = json.dumps({"detail": f"request body of {length} bytes is over the {limit} limit"})
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": body.encode()})


class Server(ThreadedServer):
    """``llm-gym serve``: uvicorn running ``make_app``'s app on ``host:port``; ``start()``
    returns once ``/health`` answers (``url`` is then set), ``stop()`` shuts it down (open
    sessions are closed, their envs with them).

    Args:
        env_id, env_args, max_sessions, session_timeout, max_message_bytes, web: as
            ``make_app``'s (``max_message_bytes`` also caps a WebSocket frame: a larger one
            closes the session with code 1009, not buffered).
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
        ping_interval: float = 10.0,
        web: bool = False,
    ) -> None:
        check_number("ping_interval", ping_interval, low=0, strict=True)
        check_int("port", port, 0, 65535)
        app = make_app(
            env_id, env_args, max_sessions=max_sessions, session_timeout=session_timeout,
            max_message_bytes=max_message_bytes, web=web,
        )  # fmt: skip
        super().__init__(
            app, host=host, port=port, ws_max_size=max_message_bytes,
            ws_ping_interval=ping_interval, ws_ping_timeout=ping_interval,
        )  # fmt: skip
