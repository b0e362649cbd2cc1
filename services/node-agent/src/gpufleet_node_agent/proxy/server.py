"""The proxy served by uvicorn in the agent's own event loop: its socket bound at start-up
(a port taken is said at once, and the node then registers no proxy), https where the
operator gives a certificate and its key."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Generator
from pathlib import Path

import uvicorn

from .app import ProxyApp
from .hosts import parse_listen
from .joined import JoinedHttpTools

log = logging.getLogger("gpufleet.node_agent.proxy")


class _DenialIsNoError(logging.Filter):
    """uvicorn logs an error after every websocket the app refuses with an HTTP answer
    (ASGI's denial response, websocket.py), and after every answer the app leaves
    incomplete: the caller got that answer; an answer is left incomplete only when the
    worker's broke off midway (forward.py, which says so), so that uvicorn closes the
    caller's connection and the caller sees it cut. Neither line says anything else."""

    LINES = frozenset(
        {
            "ASGI callable returned without completing handshake.",
            "ASGI callable returned without completing response.",
        }
    )

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() not in self.LINES


_DENIAL = _DenialIsNoError()


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        """The agent's signals stay the agent's (FastStream stops it, then the proxy)."""
        yield


class ProxyServer:
    def __init__(
        self,
        app: ProxyApp,
        listen: str,
        *,
        cert: Path | None = None,
        key: Path | None = None,
    ) -> None:
        self.app = app
        self.host, self.port = parse_listen(listen)
        self.cert, self.key = cert, key
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None
        self.sock: socket.socket | None = None

    def bind(self) -> socket.socket:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on connections of such a socket
        # (without it, a response's headers and body wait on delayed ACKs: +40 ms each)
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError:
            sock.close()
            raise
        sock.listen(1024)
        sock.set_inheritable(True)
        return sock

    async def start(self) -> None:
        """Bind (OSError when the port is taken) and serve in a task."""
        self.sock = self.bind()
        config = uvicorn.Config(
            self.app,
            http=JoinedHttpTools,  # an answer's head and body in one write (joined.py)
            lifespan="off",
            log_level="warning",
            access_log=False,
            proxy_headers=False,  # the proxy is the edge: a caller's X-Forwarded-* is not
            server_header=False,
            date_header=True,
            ssl_certfile=str(self.cert) if self.cert else None,
            ssl_keyfile=str(self.key) if self.key else None,
            timeout_keep_alive=30,
        )
        logging.getLogger("uvicorn.error").addFilter(_DENIAL)  # once: a filter is kept once
        self._server = _Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[self.sock]), name="proxy")
        while not self._server.started and not self._task.done():  # noqa: ASYNC110 - uvicorn's flag
            await asyncio.sleep(0.01)
        if self._task.done():
            self._task.result()  # its error

    async def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._task is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(self._task, timeout=5.0)
        if self.sock is not None:
            self.sock.close()
