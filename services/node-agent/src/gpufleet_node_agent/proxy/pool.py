"""The keep-alive connections to one worker's socket: at most `size` in use at once (a
request waits up to POOL_S for one), an idle one taken last in first out, dropped when the
worker closed it or it idled KEEPALIVE_S (under the 5 s a uvicorn worker keeps one). Each is
opened by upstream.open_socket: the worker's own socket, no link followed."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

from . import http1, upstream

POOL_S = 30.0
KEEPALIVE_S = 4.0


class Unreachable(Exception):
    """The worker's socket could not be connected to (missing, not its own, refused)."""


class Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.idle_since = 0.0

    def usable(self, now: float) -> bool:
        return (
            now - self.idle_since < KEEPALIVE_S
            and not self.reader.at_eof()
            and not self.writer.is_closing()
        )

    def close(self) -> None:
        """At once, whatever is unsent (the exchange on it broke off)."""
        self.writer.transport.abort()


class Pool:
    def __init__(self, socket: Path, uid: int | None, size: int = 64) -> None:
        self.socket = socket
        self.uid = uid  # who must own the socket (None: anyone)
        self._idle: list[Connection] = []
        self._free = asyncio.Semaphore(size)

    async def take(self) -> tuple[Connection, bool]:
        """A connection, and whether it served a request before. TimeoutError past POOL_S,
        Unreachable when a new one cannot be opened."""
        if self._free.locked():
            async with asyncio.timeout(POOL_S):
                await self._free.acquire()
        else:
            await self._free.acquire()
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if conn.usable(now):
                return conn, True
            conn.close()
        try:
            return await self._open(), False
        except BaseException:
            self._free.release()
            raise

    async def _open(self) -> Connection:
        try:
            sock = await upstream.open_socket(self.socket, self.uid)
        except (OSError, TimeoutError) as exc:
            raise Unreachable(str(exc) or type(exc).__name__) from None
        try:
            reader, writer = await asyncio.open_unix_connection(sock=sock, limit=http1.MAX_HEAD)
        except BaseException:
            sock.close()
            raise
        return Connection(reader, writer)

    def give_back(self, conn: Connection, keep: bool = True) -> None:
        """Its exchange ended cleanly: kept for the next request (unless not `keep`)."""
        if not keep:
            self.discard(conn)
            return
        conn.idle_since = time.monotonic()
        self._idle.append(conn)
        self._free.release()

    def discard(self, conn: Connection) -> None:
        conn.close()
        self._free.release()

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.writer.close()
            with contextlib.suppress(OSError):
                await conn.writer.wait_closed()
