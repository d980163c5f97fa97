"""``OpenEnvChatEnv``: any OpenEnv server as a multi-turn chat, and its vector env.

The ``openenv`` package (the ``serve`` extra) is imported when an env is made, never on
``import llm_gym`` or ``import llm_gym.envs``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import time
from collections.abc import Mapping
from contextlib import suppress
from typing import TYPE_CHECKING, Any

import gymnasium as gym
from gymnasium.vector import SyncVectorEnv

from llm_gym.chat.history import History
from llm_gym.checks import check_number, check_str
from llm_gym.envs.forking import ForkError
from llm_gym.envs.session import EnvResponse, SessionChatEnv, seed_stream
from llm_gym.envs.sharded import sharded_vector_env

if TYPE_CHECKING:
    from openenv.core.client_types import StepResult
    from openenv.core.sync_client import SyncEnvClient

    from llm_gym.chat.conversation import Conversation

__all__ = ["OPENENV_ID", "JSONValue", "OpenEnvChatEnv", "make_openenv_vector_env"]

OPENENV_ID = "LLMChat-OpenEnv-v0"

#: What travels over OpenEnv's wire: a JSON value.
JSONValue = str | int | float | bool | None | list["JSONValue"] | dict[str, "JSONValue"]

# openenv's client raises a server's error frame as RuntimeError("Server error: M (code: C)").
_SERVER_ERROR = re.compile(r"Server error: (?P<message>.*) \(code: (?P<code>\w+)\)", re.DOTALL)
_CAPACITY = "CAPACITY_REACHED"
_SCHEMES = ("http://", "https://", "ws://", "wss://")
_MAX_ERROR = 2000  # characters of a server's error kept in info (it may quote the action)


def _one_line(text: object, limit: int = _MAX_ERROR) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _json_text(value: JSONValue) -> str:
    return json.dumps(value, ensure_ascii=False)


def _text(value: JSONValue) -> str:
    return value if isinstance(value, str) else _json_text(value)


def _is_chat(value: object) -> bool:
    """Whether ``value`` is a list of ``{"role", "content"}`` messages (llm_gym's history)."""
    return isinstance(value, list) and all(
        isinstance(m, Mapping) and isinstance(m.get("role"), str) and "content" in m for m in value
    )


@functools.cache
def _client_class() -> type:
    """openenv's ``GenericEnvClient``, keeping the last error frame's data (its ``errors``
    name the action's bad fields; the client's exception keeps only the message), and
    refusing to step on a socket the server closed: openenv's client would silently open a
    new session there, whose env was never reset."""
    # About 2 s: any openenv.core module runs openenv/core/__init__.py, which imports the
    # server side (env_server: FastAPI, fastmcp, Gradio); the client's own modules take 0.03 s.
    from openenv import GenericEnvClient
    from websockets.protocol import State

    class _Client(GenericEnvClient):
        last_error: dict[str, Any] | None = None

        async def _send(self, message: dict[str, Any]) -> None:
            socket = getattr(self, "_ws", None)
            closed = socket is None or getattr(socket, "state", None) in (
                State.CLOSING,
                State.CLOSED,
            )
            if message.get("type") != "reset" and closed:
                raise ConnectionError("the server closed this session")
            await super()._send(message)

        async def _receive(self) -> dict[str, Any]:
            response = await super()._receive()
            if isinstance(response, dict) and response.get("type") == "error":
                data = response.get("data")
                self.last_error = data if isinstance(data, dict) else None
            return response

    return _Client


@functools.cache
def _transport_errors() -> tuple[type[BaseException], ...]:
    from websockets.exceptions import WebSocketException

    return (OSError, EOFError, asyncio.TimeoutError, WebSocketException)


class OpenEnvChatEnv(SessionChatEnv):
    """Any OpenEnv server, played by the policy one chat turn per step.

    ## Description

    A client of an environment served over OpenEnv's protocol (the ``openenv`` package's
    WebSocket sessions: any env on a Hugging Face Space, in a container, from
    ``openenv init``, or ``llm-gym serve``). Each env holds one session of its own on the
    server. ``reset`` resets the server's env and its first observation is the first user
    turn; each action's text goes to the server as ``{action_field: text}``, and the
    server's next observation is the next user turn (a served chat's history is taken as
    it is: see Observation Space). Reward and the end come from the server.

    ## Action Space

    As ``ChatEnv``: the response as a ``str`` (or token ids in ``"tokens"`` mode), or a
    ``Response``; the text (with ``assistant_prefix``) is what the server gets.

    ## Observation Space

    As ``ChatEnv``: the conversation as ``history``, ``text`` and/or ``tokens`` (and
    ``policy_mask``). A server observation becomes a user message: its ``observation_field``
    (a string as it is, any other value as JSON), or by default the whole observation as JSON
    (without ``metadata``); after the server ends the episode or ``max_turns`` cuts it, none.

    A served chat, an observation holding a ``history`` list of ``{"role", "content"}``
    messages (``llm-gym serve``), is taken as it is when no ``observation_field`` is given, so
    the episode is the served env's own: ``reset`` starts from the server's whole history
    (its system message included), and each step adds the messages the server added after
    the assistant's turn, all of them and with their roles (tool outputs, the next user
    turn), also on the step where the server ends the episode (none when ``max_turns`` cuts
    it). The client's own ``system_prompt``, when given, wins: it replaces the server's
    leading ``system_role`` messages (as ``DatasetChatEnv``'s argument wins over its task's);
    None keeps the server's.

    ## Rewards

    The server's reward for the step (``0.0`` when it sends none). ``info`` has the server's
    ``metadata`` and the ``observation``'s other fields as they came (JSON values), and
    ``invalid_move``. A step the server refuses (its ``VALIDATION_ERROR`` for an action
    that does not fit its schema, an ``EXECUTION_ERROR``, ...) is the policy's invalid
    move, never an exception out of ``step``: reward ``0.0``, the episode terminated,
    ``info["error"]`` the server's message (with the fields it names) and
    ``info["error_code"]`` its code. The last step's ``info`` also has ``task`` (the URL),
    ``episode_seed`` and ``reward``, the episode's total of the server's rewards.

    ## Starting State

    The server's first observation after its ``reset(seed=k, **reset_kwargs)``, where ``k``
    is the next ``episode_seed`` of a seeded stream: ``reset(seed=s)`` restarts the stream
    ``s`` names (the same seed sends the server the same seeds), ``reset(options={"item":
    {"episode_seed": k}})`` sends ``k``. The reset ``info`` holds ``task``, ``episode_seed``,
    ``observation`` and ``metadata``. With ``repeats=G`` each seed is served ``G`` times in
    a row (a GRPO group).

    ## Episode End

    Terminated when the server says ``done`` (truncated instead when its observation says
    ``truncated`` and not ``terminated``, as ``llm-gym serve``'s does) or refuses the action;
    truncated after ``max_turns`` turns (None: the server decides).

    ## Errors

    A server that cannot be reached fails ``gym.make`` (and a server lost mid-episode fails
    ``reset``/``step``) with one line naming the URL, a ``ConnectionError``, within
    ``connect_timeout_s`` / ``message_timeout_s``; the env takes no step until the next
    ``reset``. A full server (``CAPACITY_REACHED``) is retried with backoff for
    ``capacity_wait_s`` seconds, then fails with one line naming the URL and the capacity.

    ## Arguments

    - ``base_url``: the server's URL (``http(s)://`` or ``ws(s)://``, without ``/ws``).
    - ``action_field``: the action's field that carries the text (default ``"text"``).
    - ``observation_field``: the observation's field that becomes the user message (None:
      see Observation Space).
    - ``reset_kwargs``: more keyword arguments for the server's ``reset`` (JSON values).
    - ``api_key``: sent as ``Authorization: Bearer KEY`` when the session opens (a server
      started with ``llm-gym serve --api-key``; None: no header).
    - ``connect_timeout_s``, ``message_timeout_s``: how long to wait for the connection and
      for each answer (defaults 5 and 30 seconds).
    - ``capacity_wait_s``: how long a full server is retried (default 5 seconds; 0: never).
    - ``max_turns``: turns per episode (None: until the server ends it).
    - ``seed``, ``repeats``, ``group_repeats``, ``shard``: the stream of episode seeds, as
      ``DatasetChatEnv``'s (``llm_gym.envs.sharded_env_fns`` shards it over sub-envs).
    - ``system_prompt``: the first message of each episode, as ``ChatEnv``'s; over a served
      chat it replaces the server's system message(s) (None: the server's stay).
    - ``**chat_options``: as ``ChatEnv`` (``input_mode``, ``tokenizer``, ...); tools are not
      offered (the server is the world).

    ## Version History

    - v0: Initial version.

    ## Example

    Against OpenEnv's echo env (``openenv init my_echo``, served with ``uvicorn
    server.app:app --port 8000`` from its folder)::

        env = gym.make("LLMChat-OpenEnv-v0", base_url="http://127.0.0.1:8000",
                       action_field="message", observation_field="echoed_message")
        obs, info = env.reset(seed=0)  # obs["history"][-1]["content"]: the server's greeting
        obs, reward, terminated, truncated, info = env.step("hello")  # reward 0.5
        env.close()

    No server there is one line, at once:

    >>> import gymnasium as gym, llm_gym
    >>> gym.make("LLMChat-OpenEnv-v0", base_url="http://127.0.0.1:9")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ConnectionError: OpenEnv server at http://127.0.0.1:9 did not answer: ...
    """

    shares_conversations = False  # each env's episode lives in its own server session
    seed_field = "episode_seed"

    def __init__(
        self,
        base_url: str,
        *,
        action_field: str = "text",
        observation_field: str | None = None,
        reset_kwargs: Mapping[str, JSONValue] | None = None,
        api_key: str | None = None,
        connect_timeout_s: float = 5.0,
        message_timeout_s: float = 30.0,
        capacity_wait_s: float = 5.0,
        **options: object,
    ) -> None:
        check_str("base_url", base_url)
        if not base_url.startswith(_SCHEMES):
            raise ValueError(
                f"base_url must be the server's http(s):// or ws(s):// URL, got {base_url!r}"
            )
        if not check_str("action_field", action_field):
            raise ValueError("action_field must name the action's text field, got ''")
        check_str("observation_field", observation_field, optional=True)
        if reset_kwargs is not None and not isinstance(reset_kwargs, Mapping):
            raise TypeError(
                f"reset_kwargs must be a dict or None, got {type(reset_kwargs).__name__}"
            )
        self.base_url = base_url.rstrip("/")
        self.action_field = action_field
        self.observation_field = observation_field
        self.reset_kwargs = dict(reset_kwargs or {})
        self._api_key = check_str("api_key", api_key, optional=True) or None
        self.connect_timeout_s = check_number(
            "connect_timeout_s", connect_timeout_s, 0, strict=True
        )
        self.message_timeout_s = check_number(
            "message_timeout_s", message_timeout_s, 0, strict=True
        )
        self.capacity_wait_s = check_number("capacity_wait_s", capacity_wait_s, 0)
        super().__init__(seed_stream(self.seed_field, query=self.base_url), **options)
        self._client: SyncEnvClient | None = None
        # How many messages the server's chat history held after the last reset or step: a
        # step's new messages are those past it and the assistant's turn.
        self._served = 0
        # Why the session takes no step until a reset succeeds (a lost server, a failed reset).
        self._blocked: Exception | None = None
        self._session()  # an unreachable server fails here, naming the URL

    # -- the session ------------------------------------------------------------------------

    def _session(self) -> SyncEnvClient:
        """The connected client of this env's session (opened again after ``close``)."""
        if self._client is None:
            client = _client_class()(
                base_url=self.base_url,
                connect_timeout_s=self.connect_timeout_s,
                message_timeout_s=self.message_timeout_s,
                headers={"Authorization": f"Bearer {self._api_key}"} if self._api_key else None,
            ).sync()
            try:
                client.connect()
            except _transport_errors() as error:
                with suppress(Exception):
                    client.close()
                raise self._unreachable(error) from None
            self._client = client
        return self._client

    def _unreachable(self, error: BaseException, when: str = "") -> ConnectionError:
        detail = _one_line(f"{type(error).__name__}: {error}", 400)
        return ConnectionError(
            f"OpenEnv server at {self.base_url} did not answer{when}: {detail} (is it running? "
            f"connect_timeout_s={self.connect_timeout_s:g}, "
            f"message_timeout_s={self.message_timeout_s:g})"
        )

    def _call(
        self, method: str, argument: Mapping[str, JSONValue]
    ) -> tuple[StepResult | None, tuple[str, str] | None]:
        """``reset(**argument)`` or ``step(argument)`` on the session: the result, or the
        server's error as ``(code, message)``; a lost connection raises ``ConnectionError``."""
        client = self._session()
        client.async_client.last_error = None
        try:
            if method == "reset":
                return client.reset(**argument), None
            return client.step(dict(argument)), None
        except RuntimeError as error:
            match = _SERVER_ERROR.fullmatch(str(error))
            if match is None:
                raise
            return None, (match["code"], self._error_message(match["message"]))
        except _transport_errors() as error:
            lost = self._unreachable(error, f" during {method}")
            self._blocked = ConnectionError(f"{lost}; reset to open a new session")
            raise lost from None

    def _error_message(self, message: str) -> str:
        """The server's message, with the fields its ``VALIDATION_ERROR`` names."""
        data = self._client.async_client.last_error if self._client is not None else None
        details = []
        for item in (data or {}).get("errors") or []:
            if isinstance(item, Mapping):
                where = ".".join(str(part) for part in item.get("loc") or ())
                details.append(f"{where}: {item.get('msg', '')}" if where else str(item.get("msg")))
        if details:
            message = f"{message}: {'; '.join(details)}"
        return _one_line(message)

    def _reconnect(self) -> None:
        # The server closed a refused session's socket: the next call opens a new one.
        if self._client is not None:
            with suppress(Exception):
                self._client.disconnect()

    def fork(self) -> OpenEnvChatEnv:
        """Refused (``ForkError``): the episode's state is the server's, and OpenEnv's
        protocol offers no snapshot of a session to copy it by."""
        raise ForkError(
            f"OpenEnvChatEnv cannot fork: its episode's state is on the server at "
            f"{self.base_url}, and OpenEnv's protocol offers no snapshot to copy it by"
        )

    def close(self) -> None:
        """End the server session (a later ``reset`` opens a new one)."""
        client, self._client = self._client, None
        if client is not None:
            with suppress(Exception):
                client.close()
        super().close()

    # -- the session's turns -----------------------------------------------------------------

    def given_item(self, options: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """The given item (``{"episode_seed": k}``, an int >= 0); checked before anything
        changes, so a bad one leaves the running episode as it was."""
        if isinstance(options, Mapping) and isinstance(options.get("item"), Mapping):
            options = {**options, "item": {"query": self.base_url, **options["item"]}}
        return super().given_item(options)

    def episode_start(self, item: Mapping[str, Any]) -> tuple[History, dict[str, Any]]:
        """Reset the server's env with ``item``'s ``episode_seed`` (a full server retried
        for ``capacity_wait_s``): its first observation as the prompt."""
        seed = int(item["episode_seed"])
        self._blocked = gym.error.ResetNeeded(
            f"the last reset of the OpenEnv server at {self.base_url} failed: reset again"
        )
        deadline, delay = time.monotonic() + self.capacity_wait_s, 0.05
        while True:
            result, error = self._call("reset", {**self.reset_kwargs, "seed": seed})
            if error is None:
                break
            code, message = error
            left = deadline - time.monotonic()
            self._reconnect()  # a refused session's socket may be closed
            if code != _CAPACITY:
                raise RuntimeError(
                    f"OpenEnv server at {self.base_url} refused reset: {message} (code: {code})"
                )
            if left <= 0:
                raise ConnectionError(
                    f"OpenEnv server at {self.base_url} is full: {message} (code: {code}; "
                    f"still full after capacity_wait_s={self.capacity_wait_s:g})"
                )
            time.sleep(min(delay, left))
            delay *= 2
        observation, metadata = self._fields(result)
        info = {"task": self.base_url, "episode_seed": seed}
        info.update(observation=observation, metadata=metadata)
        chat = self._served_chat(result.observation)
        if chat is None:
            history = self._history_for(self._message(result.observation))
        else:
            history = self._own_system_prompt(chat)
            self._served = len(chat)
        self._blocked = None
        return history, info

    def env_response(
        self, conversation: Conversation, text: str, item: Mapping[str, Any]
    ) -> EnvResponse:
        """Send ``text`` to the server: its reward, end and next observation (the next user
        message); a refused action is an invalid move that ends the episode."""
        if self._blocked is not None:  # a fresh exception of the same kind, each step
            raise type(self._blocked)(*self._blocked.args)
        result, error = self._call("step", {self.action_field: text})
        if error is not None:
            info = {"invalid_move": True, "error": error[1], "error_code": error[0]}
            return EnvResponse(None, 0.0, terminated=True, info=info)
        observation, metadata = self._fields(result)
        info = {"invalid_move": False, "observation": observation, "metadata": metadata}
        terminated, truncated = bool(result.done), False
        if terminated and observation.get("truncated") is True:
            terminated = observation.get("terminated") is True  # the served env's cut
            truncated = not terminated
        chat = self._served_chat(result.observation)
        if chat is not None:  # every message the server added, its last step's too
            added = self._added(chat, result.done)
            self._served = len(chat)
        else:
            added = None if result.done else self._message(result.observation)
        return EnvResponse(added, float(result.reward or 0.0), terminated, truncated, info)

    def end_info(self, item: Mapping[str, Any], cut: bool) -> dict[str, Any]:
        """The episode's record names its server and seed."""
        return {"task": self.base_url, "episode_seed": item["episode_seed"]}

    # -- observations -----------------------------------------------------------------------

    @staticmethod
    def _fields(result: StepResult) -> tuple[dict[str, JSONValue], dict[str, JSONValue]]:
        """The observation's fields but ``metadata``, and the step's metadata."""
        observation = result.observation if isinstance(result.observation, dict) else {}
        metadata = result.metadata or observation.get("metadata") or {}
        fields = {key: value for key, value in observation.items() if key != "metadata"}
        return fields, dict(metadata) if isinstance(metadata, Mapping) else {"value": metadata}

    def _message(self, observation: Mapping[str, JSONValue]) -> str:
        """The user message of a server observation (see Observation Space)."""
        if not isinstance(observation, Mapping):
            return _json_text(observation)
        if self.observation_field is not None:
            if self.observation_field not in observation:
                error = (
                    f"observation_field={self.observation_field!r} is not in the observation of "
                    f"the OpenEnv server at {self.base_url}; its fields are {sorted(observation)}"
                )
                self._blocked = gym.error.ResetNeeded(f"{error}: reset to start again")
                raise ValueError(error)
            return _text(observation[self.observation_field])
        return _json_text({key: v for key, v in observation.items() if key != "metadata"})

    def _served_chat(self, observation: Mapping[str, JSONValue]) -> list[dict[str, str]] | None:
        """The server's chat history (``llm-gym serve``'s ``history``), or None: none there,
        or ``observation_field`` names what to read instead."""
        if self.observation_field is not None or not isinstance(observation, Mapping):
            return None
        history = observation.get("history")
        if not (_is_chat(history) and history):
            return None
        return [{"role": m["role"], "content": _text(m["content"])} for m in history]

    def _own_system_prompt(self, chat: list[dict[str, str]]) -> History:
        """The served chat's start, the client's ``system_prompt`` (when given) in place of
        the server's leading system messages."""
        if self.system_prompt is None:
            return History(chat)
        start = 0
        while start < len(chat) and chat[start]["role"] == self.system_role:
            start += 1
        return History([{"role": self.system_role, "content": self.system_prompt}, *chat[start:]])

    def _added(self, chat: list[dict[str, str]], done: bool) -> list[dict[str, str]]:
        """The messages the server added after the assistant's turn."""
        if len(chat) > self._served:
            return chat[self._served + 1 :]
        # A history that did not grow is not an append-only chat: its last message is the
        # next user turn, as any other observation's.
        return [] if done else [{"role": self.user_role, "content": chat[-1]["content"]}]


def make_openenv_vector_env(num_envs: int = 1, **kwargs: object) -> SyncVectorEnv:
    """The ``vector_entry_point`` of ``LLMChat-OpenEnv-v0``: ``num_envs`` sessions side by
    side, one ``OpenEnvChatEnv`` each (its own client session) on one shard of the stream of
    episode seeds (``sharded_vector_env``: ``repeats=G`` with ``group_repeats=True`` puts
    each seed in ``G`` neighbouring sub-envs; a sub-env that cannot connect closes the
    sessions the others opened). The server must admit ``num_envs`` sessions.

    ``gym.make_vec("LLMChat-OpenEnv-v0", num_envs=4, base_url=URL, ...)`` calls it."""
    return sharded_vector_env(OPENENV_ID, num_envs, **kwargs)
