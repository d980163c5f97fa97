"""``ThreadedServer``: uvicorn serving an ASGI app from a thread of this process, the socket
bound when it is made (a busy port fails there, not in the thread) and ``start()`` returning
once a health path answers. ``llm-gym serve`` (OpenEnv) and ``llm-gym gateway`` run on it."""

from __future__ import annotations

import ipaddress
import socket
import threading
import urllib.request
from typing import Any

from llm_gym.checks import check_int

__all__ = ["ThreadedServer", "exposure_warning"]


def exposure_warning(host: str, api_key: str | None, flag: str = "--api-key") -> str | None:
    """The line to print when ``host`` is reachable from other machines and no ``api_key``
    guards it; None on loopback or with a key.

    >>> exposure_warning("127.0.0.1", None) is None, exposure_warning("0.0.0.0", "k") is None
    (True, True)
    >>> exposure_warning("0.0.0.0", None)
    'warning: serving on 0.0.0.0 without --api-key: anyone who reaches this port can call it'
    """
    if api_key:
        return None
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: only "localhost" is known to stay on this machine
        loopback = host == "localhost"
    if loopback:
        return None
    return f"warning: serving on {host} without {flag}: anyone who reaches this port can call it"


class ThreadedServer:
    """uvicorn running ``app`` on ``host:port`` in a daemon thread.

    Args:
        app: an ASGI application.
        host: the address to bind (loopback by default).
        port: the port (0: a free one; ``port`` then holds the one bound).
        health: the path ``start()`` polls until it answers 200.
        **options: more ``uvicorn.Config`` options (``ws_max_size``, ...).
    """

    def __init__(
        self,
        app: Any,
        *,
        host: str = "127.0.0.1",
        port: int = 8000,
        health: str = "/health",
        **options: Any,
    ) -> None:
        import uvicorn

        port = check_int("port", port, 0, 65535)
        self.socket = socket.create_server((host, port))  # bound now: a busy port fails here
        self.host, self.port, self.health = host, self.socket.getsockname()[1], health
        config = uvicorn.Config(app, log_level="warning", **options)
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None
        self.url: str | None = None

    def start(self, timeout: float = 30.0) -> str:
        """Serve in a thread; the URL once the health path answers."""
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self.socket]}, daemon=True
        )
        self._thread.start()
        url = f"http://{self.host}:{self.port}"
        wait = 0.02
        for _ in range(int(timeout / wait)):
            if not self._thread.is_alive():
                raise RuntimeError(f"the server for {url} stopped while starting")
            try:
                with urllib.request.urlopen(f"{url}{self.health}", timeout=1) as reply:
                    if reply.status == 200:
                        self.url = url
                        return url
            except OSError:
                pass
            threading.Event().wait(wait)
        self.stop()
        raise TimeoutError(f"{url}{self.health} did not answer within {timeout:g} s")

    def wait(self) -> None:
        """Block until the server stops (Ctrl-C stops it)."""
        if self._thread is not None:
            self._thread.join()

    def stop(self) -> None:
        """Shut the server down and release the port."""
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.socket.close()

    def __enter__(self) -> ThreadedServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
