"""The members of OpenEnv that are not its public API, reached from here only: the session
table of its ``HTTPEnvServer`` (``llm-gym serve --web`` gives each browser session a
session of that table) and two helpers of its web interface. They hold for the OpenEnv
version ``OPENENV_VERSION`` that llm_gym pins; another version is refused in one line,
naming the version expected, before any of them is used."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from typing import Any

__all__ = ["OPENENV_VERSION", "ServerSessions", "check_openenv_version", "web_form"]

OPENENV_VERSION = "0.10.0"  # pyproject's pin (the "serve" extra)


def check_openenv_version(expected: str = OPENENV_VERSION) -> None:
    """Raise ``RuntimeError`` unless the installed ``openenv`` is version ``expected``."""
    try:
        installed = importlib.metadata.version("openenv")
    except importlib.metadata.PackageNotFoundError:
        installed = None
    if installed != expected:
        found = "no openenv" if installed is None else f"openenv {installed}"
        raise RuntimeError(
            f"llm-gym serve --web reaches members of OpenEnv's server that are not its public "
            f"API, as OpenEnv {expected} has them, and {found} is installed: "
            f"pip install openenv=={expected}"
        )


class ServerSessions:
    """``server``'s (an OpenEnv ``HTTPEnvServer``'s) session table: its envs by session id,
    made and destroyed as its WebSocket sessions are (counted in its ``max_sessions``)."""

    def __init__(self, server: Any) -> None:
        check_openenv_version()
        self._server = server

    def env(self, session: str | None) -> Any | None:
        """The env of ``session`` (None: no such session, or ``session`` None)."""
        return self._server._sessions.get(session) if session else None

    async def create(self) -> tuple[str, Any]:
        """A new session and its env; OpenEnv's ``CAPACITY_REACHED`` error when full."""
        return await self._server._create_session()

    async def run(self, session: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in ``session``'s executor, where OpenEnv runs its env's calls."""
        return await self._server._run_in_session_executor(session, fn, *args)

    def touch(self, session: str, step: bool = False) -> None:
        """Mark ``session`` active now (``step``: and count a step)."""
        self._server._update_session_activity(session, increment_step=step)

    async def destroy(self, session: str) -> None:
        """End ``session`` and close its env, freeing its slot."""
        await self._server._destroy_session(session)

    def last_activity(self, session: str) -> float | None:
        """When ``session`` was last active (``time.time()``'s clock); None: it has ended."""
        info = self._server._session_info.get(session)
        return None if info is None else info.last_activity_at

    def metadata(self, env_id: str) -> Any:
        """The web interface's metadata of the served env (its name, its README)."""
        from openenv.core.env_server.web_interface import load_environment_metadata

        return load_environment_metadata(self._server._env_factory, env_id)


def web_form(action_cls: type) -> tuple[list[dict[str, Any]], bool]:
    """The web interface's form for ``action_cls``: its fields, and whether it is a chat
    env's action."""
    from openenv.core.env_server.web_interface import _extract_action_fields, _is_chat_env

    check_openenv_version()
    return _extract_action_fields(action_cls), _is_chat_env(action_cls)
