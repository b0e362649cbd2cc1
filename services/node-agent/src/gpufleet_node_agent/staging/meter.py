"""How far one transfer is, counted against what it may write (Transfer.limit_bytes): its
progress told at most every half second, on the agent's event loop even when the bytes are
counted in a client's thread."""

from __future__ import annotations

import asyncio
import threading
import time

from ..steps.base import WorkerFailed
from .registry import Moved, Transfer

EVERY_S = 0.5


def too_large(what: str, limit: int) -> WorkerFailed:
    return WorkerFailed(f"{what} is too large: more than the {limit} bytes left on the disk")


def shown(url: str) -> str:
    """A URL as a reason may name it: without a user or password in it."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, path = rest.partition("/")
    return f"{scheme}://{authority.rpartition('@')[2]}{slash}{path}"


class Meter:
    """Made on the event loop; `add` may be called from any thread."""

    def __init__(
        self, what: str, t: Transfer, total: int | None = None, *, bounded: bool = True
    ) -> None:
        self.what = what
        self.bounded = bounded  # an upload writes nothing on the node: only told
        self.t = t
        self.total = total
        self.done = 0
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._told = 0.0
        self._lock = threading.Lock()  # a client's threads count at once (s3 parts)

    def expect(self, total: int) -> None:
        """The size is known (before anything is written): refused at once past the limit."""
        self.total = total
        if total > self.t.limit_bytes:
            raise too_large(self.what, self.t.limit_bytes)

    def add(self, n: int) -> None:
        with self._lock:
            self.done += n
            if self.bounded and self.done > self.t.limit_bytes:
                raise too_large(self.what, self.t.limit_bytes)
            now = time.monotonic()
            if now - self._told < EVERY_S:
                return
            self._told = now
        self._tell()

    def finish(self) -> None:
        self._tell()

    def _tell(self) -> None:
        moved = Moved(self.done, self.total)
        if threading.get_ident() == self._loop_thread:
            self.t.progress(moved)
        else:
            self._loop.call_soon_threadsafe(self.t.progress, moved)
