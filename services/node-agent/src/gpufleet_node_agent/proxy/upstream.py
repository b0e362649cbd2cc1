"""The only place the proxy connects to: a worker's own unix socket (`<worker dir>/serve/
http.sock`), and what of a request and its answer crosses it.

The socket's directory is the worker's to write (its container binds it at /run/gpufleet),
so the worker could put a symbolic link there in place of its socket, pointing at a socket
of the node's (podman's API, another job's). `connect` follows no link: it opens the path
with O_PATH|O_NOFOLLOW, requires a socket owned by the worker's uid, and connects to that
very inode (through /proc/self/fd, which also keeps the path short of the 108 bytes a
socket's address may have). `open_socket` is the only way to a worker: HTTP goes through
pool.py's connections, a websocket through websocket.py's, both opened by it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import stat
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from gpufleet_contracts.serving import NOTEBOOK_COOKIE

CONNECT_S = 5.0

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


def _without_our_cookie(value: bytes) -> bytes:
    """A Cookie header less the proxy's own cookie (NOTEBOOK_COOKIE)."""
    ours = NOTEBOOK_COOKIE.encode()
    kept = [c.strip() for c in value.split(b";")]
    return b"; ".join(c for c in kept if c and c.partition(b"=")[0].strip() != ours)


def request_headers(
    headers: Sequence[tuple[bytes, bytes]],
    *,
    client: str,
    proto: str,
    host: str,
    credentials: bool = False,
) -> Headers:
    """What the worker gets of a caller's headers: no hop-by-hop, no X-Forwarded-* of the
    caller's, the proxy's own X-Forwarded-For/-Proto/-Host; no Authorization or Cookie
    unless `credentials` (a notebook's: Jupyter checks them itself), and never the proxy's
    own cookie."""
    drop = HOP_BY_HOP | NOT_TO_THE_JOB | _connection_named(headers) | set(FORWARDED)
    if credentials:
        drop -= {"authorization", "cookie"}
    out: Headers = []
    for k, v in headers:
        name = k.decode("latin-1").lower()
        if name in drop:
            continue
        if name == "cookie":
            v = _without_our_cookie(v)
            if not v:
                continue
        out.append((k, v))
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


class NoSocket(ConnectionError):
    """Not the worker's socket: missing, a link, not a socket, or another user's."""


@contextlib.contextmanager
def exact(path: str, uid: int | None) -> Iterator[str]:
    """The address to connect to for the socket at `path` itself (no link followed), owned
    by `uid` (or root); valid inside the block. NoSocket when it is not that."""
    try:
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise NoSocket(f"no socket: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISSOCK(st.st_mode):
            raise NoSocket("not a socket")
        if uid is not None and st.st_uid not in (uid, 0):
            raise NoSocket("a socket of another user")
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


async def open_socket(path: Path, uid: int | None) -> socket.socket:
    """A connection to the worker's socket at `path`, checked as `exact` says (NoSocket,
    or the connect's OSError)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        with exact(str(path), uid) as address:
            async with asyncio.timeout(CONNECT_S):
                await asyncio.get_running_loop().sock_connect(sock, address)
    except BaseException:
        sock.close()
        raise
    return sock
