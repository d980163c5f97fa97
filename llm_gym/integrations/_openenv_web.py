"""``llm-gym serve --web``: OpenEnv's web interface over one env per browser session
(``llm_gym.integrations.openenv_server``'s ``make_app(web=True)``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any

from llm_gym.integrations._openenv_gate import StepTimeout
from llm_gym.integrations._openenv_private import ServerSessions, web_form


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

    def __init__(
        self, server: Any, table: ServerSessions, metadata: Any, session_timeout: float | None
    ) -> None:
        self.table, self.metadata, self.session_timeout = table, metadata, session_timeout
        self.action_cls, self.observation_cls = server.action_cls, server.observation_cls
        self.env = _PageView()
        self.sessions: dict[str, str] = {}  # the page's session hash -> OpenEnv's session id
        self._reaper: asyncio.Task | None = None

    @staticmethod
    def _page() -> str:
        from gradio.context import LocalContext

        page = getattr(LocalContext.request.get(None), "session_hash", None)
        if not page:
            raise RuntimeError("no browser session: play the env in the page at /web/")
        return page

    async def _session(self, create: bool) -> tuple[str, str, Any]:
        page = self._page()
        session = self.sessions.get(page)
        env = self.table.env(session)
        if env is None:
            if not create:
                raise RuntimeError("this page's session ended (closed or idle): reset")
            session, env = await self.table.create()  # CAPACITY: the page says
            self.sessions[page] = session
            if self.session_timeout is not None and self._reaper is None:
                self._reaper = asyncio.create_task(self._reap(self.session_timeout))
        return page, session, env

    async def _call(self, page: str, session: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return await self.table.run(session, fn, *args)
        except StepTimeout:
            await self._end(page)
            raise

    async def reset_environment(self, reset_kwargs: Mapping[str, Any] | None = None) -> dict:
        """Reset this page's env (made on its first reset)."""
        from openenv.core.env_server.serialization import serialize_observation

        page, session, env = await self._session(create=True)
        seed = (reset_kwargs or {}).get("seed")
        observation = await self._call(page, session, env.reset, seed)
        self.table.touch(session)
        return serialize_observation(observation)

    async def step_environment(self, action_data: Mapping[str, Any]) -> dict:
        """Step this page's env."""
        from openenv.core.env_server.serialization import (
            deserialize_action_with_preprocessing,
            serialize_observation,
        )

        action = deserialize_action_with_preprocessing(dict(action_data), self.action_cls)
        page, session, env = await self._session(create=False)
        observation = await self._call(page, session, env.step, action)
        self.table.touch(session, step=True)
        return serialize_observation(observation)

    def get_state(self) -> dict[str, Any]:
        """This page's env's state ({} before its first reset)."""
        env = self.table.env(self.sessions.get(self._page()))
        return {} if env is None else env.state.model_dump()

    async def _end(self, page: str) -> None:
        session = self.sessions.pop(page, None)
        if session is not None:
            await self.table.destroy(session)

    async def _reap(self, timeout: float) -> None:
        while True:
            await asyncio.sleep(min(timeout / 4, 5.0))
            now = time.time()
            for page, session in list(self.sessions.items()):
                last = self.table.last_activity(session)
                if last is None or now - last > timeout:
                    await self._end(page)


def mount_web(app: Any, server: Any, env_id: str, session_timeout: float | None) -> Any:
    """``app`` with OpenEnv's web interface at ``/web`` (as its ``create_web_interface_app``
    builds it) over ``_BrowserSessions``, not its one shared env; its JSON routes
    (``/web/reset``, ``/web/step``, ``/ws/ui``) are left out: they have no session."""
    import gradio as gr
    from fastapi.responses import RedirectResponse
    from openenv.core.env_server.gradio_theme import OPENENV_GRADIO_CSS, OPENENV_GRADIO_THEME
    from openenv.core.env_server.gradio_ui import build_gradio_app, get_gradio_display_title
    from openenv.core.env_server.web_interface import get_quick_start_markdown

    table = ServerSessions(server)  # first: another OpenEnv version is refused here
    metadata = table.metadata(env_id)
    manager = _BrowserSessions(server, table, metadata, session_timeout)

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

    action, observation = server.action_cls, server.observation_cls
    quick_start = get_quick_start_markdown(metadata, action, observation)
    fields, is_chat = web_form(action)
    blocks = build_gradio_app(
        manager, fields, metadata, is_chat,
        title=metadata.name, quick_start_md=quick_start,
    )  # fmt: skip
    blocks.title = get_gradio_display_title(metadata)
    with blocks:
        blocks.unload(release)
    return gr.mount_gradio_app(
        app, blocks, path="/web", theme=OPENENV_GRADIO_THEME, css=OPENENV_GRADIO_CSS
    )
