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

import functools
import queue
import threading
from collections.abc import Callable, Mapping
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
from llm_gym.integrations._openenv_gate import (
    MAX_DEPTH,
    TIMEOUT_MARK,
    ASGIApp,
    Gate,
    StepTimeout,
)
from llm_gym.integrations._openenv_web import mount_web
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


MAX_MESSAGE_BYTES = 1 << 20  # 1 MiB: a response of a few hundred thousand tokens
STEP_TIMEOUT = 60.0
# The info keys where llm_gym's tasks put the reference: GSM8K's and reasoning-gym's, the
# products' ``answer``; MATH's ``solution``; HumanEval's ``canonical_solution`` and ``test``
# (its hidden tests); reasoning-gym's ``metadata`` (it often holds the solution's parts).
# A reset's info is the item's fields, so these are there from the first observation.
REFERENCE_KEYS = frozenset({"answer", "solution", "canonical_solution", "test", "metadata"})
_MAX_TOKEN_ID = 2**31 - 1  # every tokenizer's ids fit; int64 would overflow past 2**63


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
                              f"step timeout {TIMEOUT_MARK}: open a new session")  # fmt: skip
        box: list[tuple[bool, Any]] = []
        done = threading.Event()
        self._calls.put((fn, box, done))
        if not done.wait(timeout):
            self.spent = True
            raise StepTimeout(
                f"{what} ran past the step timeout of {timeout:g} s {TIMEOUT_MARK}: the "
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
        app = mount_web(app, server, env_id, session_timeout)
    return Gate(app, session_timeout, max_message_bytes, api_key)


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
