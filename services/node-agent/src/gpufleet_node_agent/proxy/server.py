"""The proxy served by uvicorn in the agent's own event loop: its sockets bound at start-up
(a port taken is said at once, and the node then registers no proxy), https where the
operator gives a certificate and its key. A reserved port of one job (reserved.py) is
served the same way, on each allowed address."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable, Generator, Sequence
from pathlib import Path

import uvicorn

from .app import Receive, Scope, Send
from .hosts import parse_listen
from .joined import JoinedHttpTools

log = logging.getLogger("gpufleet.node_agent.proxy")

Asgi = Callable[[Scope, Receive, Send], Awaitable[None]]


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
    """`app` on `listen` (`host:port`, or several); `limit_concurrency`: its connections and
    requests at once, past which uvicorn answers 503 (None: no limit)."""

    def __init__(
        self,
        app: Asgi,
        listen: str | Sequence[str],
        *,
        cert: Path | None = None,
        key: Path | None = None,
        limit_concurrency: int | None = None,
    ) -> None:
        self.app = app
        self.binds = [parse_listen(a) for a in ([listen] if isinstance(listen, str) else listen)]
        self.host, self.port = self.binds[0]
        self.cert, self.key = cert, key
        self.limit_concurrency = limit_concurrency
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None
        self.socks: list[socket.socket] = []

    @staticmethod
    def bind(host: str, port: int) -> socket.socket:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on connections of such a socket
        # (without it, a response's headers and body wait on delayed ACKs: +40 ms each)
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            sock.close()
            raise
        sock.listen(1024)
        sock.set_inheritable(True)
        return sock

    async def start(self) -> None:
        """Bind (OSError when a port is taken: none stays bound) and serve in a task."""
        try:
            for host, port in self.binds:
                self.socks.append(self.bind(host, port))
        except OSError:
            self._close_socks()
            raise
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
            limit_concurrency=self.limit_concurrency,
        )
        logging.getLogger("uvicorn.error").addFilter(_DENIAL)  # once: a filter is kept once
        self._server = _Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=self.socks), name="proxy")
        while not self._server.started and not self._task.done():  # noqa: ASYNC110 - uvicorn's flag
            await asyncio.sleep(0.01)
        if self._task.done():
            try:
                self._task.result()  # its error
            finally:
                self._close_socks()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._task is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(self._task, timeout=5.0)
        self._close_socks()

    def _close_socks(self) -> None:
        socks, self.socks = self.socks, []
        for sock in socks:
            sock.close()
