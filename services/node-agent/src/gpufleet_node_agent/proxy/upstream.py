"""The only place the proxy connects to: a worker's own unix socket (`<worker dir>/serve/
http.sock`), and what of a request and its answer crosses it.

The socket's directory is the worker's to write (its container binds it at /run/gpufleet),
so the worker could put a symbolic link there in place of its socket, pointing at a socket
of the node's (podman's API, another job's). `connect` follows no link: it opens the path
with O_PATH|O_NOFOLLOW, requires a socket owned by the worker's uid, and connects to that
very inode (through /proc/self/fd, which also keeps the path short of the 108 bytes a
socket's address may have).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path

import httpcore

CONNECT_S = 5.0
READ_S = 600.0  # an inference may take minutes; the caller may give up earlier
POOL_S = 30.0
TIMEOUTS = {"connect": CONNECT_S, "read": READ_S, "write": READ_S, "pool": POOL_S}

# Hop-by-hop (RFC 9110 7.6.1) and what the proxy itself consumed: never passed on.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
# The caller's credentials for the proxy and for other origins: not the job's to see.
NOT_TO_THE_JOB = frozenset({"authorization", "cookie", "host", "forwarded"})
FORWARDED = ("x-forwarded-for", "x-forwarded-proto", "x-forwarded-host", "x-real-ip")

Headers = list[tuple[bytes, bytes]]


def _connection_named(headers: Iterable[tuple[bytes, bytes]]) -> set[str]:
    """The headers a Connection header names (hop-by-hop too)."""
    named: set[str] = set()
    for k, v in headers:
        if k.lower() == b"connection":
            named.update(t.strip().lower() for t in v.decode("latin-1").split(",") if t.strip())
    return named


def request_headers(
    headers: Sequence[tuple[bytes, bytes]], *, client: str, proto: str, host: str
) -> Headers:
    """What the worker gets of a caller's headers: no hop-by-hop, no Authorization or Cookie,
    no X-Forwarded-* of the caller's; the proxy's own X-Forwarded-For/-Proto/-Host."""
    drop = HOP_BY_HOP | NOT_TO_THE_JOB | _connection_named(headers) | set(FORWARDED)
    out = [(k, v) for k, v in headers if k.decode("latin-1").lower() not in drop]
    out += [
        (b"host", host.encode("latin-1")),
        (b"x-forwarded-for", client.encode("latin-1")),
        (b"x-forwarded-proto", proto.encode("latin-1")),
        (b"x-forwarded-host", host.encode("latin-1")),
    ]
    return out


def response_headers(headers: Sequence[tuple[bytes, bytes]]) -> Headers:
    """What the caller gets of the worker's headers: no hop-by-hop."""
    drop = HOP_BY_HOP | _connection_named(headers)
    return [(k, v) for k, v in headers if k.decode("latin-1").lower() not in drop]


class ExactSocket(httpcore.AsyncNetworkBackend):
    """Unix sockets only, and only a socket (no link) owned by `uid`; no TCP at all."""

    def __init__(self, uid: int | None) -> None:
        self.uid = uid
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's signature
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("the proxy connects to its workers' sockets only")

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's signature
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise httpcore.ConnectError(f"no socket: {exc.strerror}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISSOCK(st.st_mode):
                raise httpcore.ConnectError("not a socket")
            if self.uid is not None and st.st_uid not in (self.uid, 0):
                raise httpcore.ConnectError("a socket of another user")
            return await self._inner.connect_unix_socket(
                f"/proc/self/fd/{fd}", timeout=timeout, socket_options=socket_options
            )
        finally:
            os.close(fd)

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def pool(socket: Path, uid: int | None, connections: int = 64) -> httpcore.AsyncConnectionPool:
    """Connections to one worker's socket (kept alive a few seconds between requests)."""
    return httpcore.AsyncConnectionPool(
        uds=str(socket),
        network_backend=ExactSocket(uid),
        max_connections=connections,
        keepalive_expiry=5.0,
        retries=0,
    )
