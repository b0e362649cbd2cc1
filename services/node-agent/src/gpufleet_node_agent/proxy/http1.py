"""HTTP/1.1 on one connection to a worker (RFC 9112): a request's head written, an answer's
head read (informational answers skipped) and its body read as its framing says:
Content-Length, chunked (trailers dropped), or up to the close. Plain bytes in and out; what
goes to which side is upstream.py's, which connection pool.py's."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

MAX_HEAD = 64 * 2**10  # an answer's head (and a chunk's size line), at most
READ_SIZE = 64 * 2**10  # a body relayed in parts of at most this
NO_BODY = frozenset({204, 304})
_CRLF = b"\r\n"
# What a header's name (a token, RFC 9110 5.6.2) and value may not hold.
_NOT_TOKEN = re.compile(rb"[^!#$%&\'*+\-.^_`|~0-9A-Za-z]")
_NOT_VALUE = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")


class ProtocolError(Exception):
    """Not an HTTP/1.1 exchange the proxy can relay (the worker's answer, or a request that
    would not be one)."""


@dataclass(frozen=True)
class Answer:
    status: int
    headers: list[tuple[bytes, bytes]]  # as the worker sent them
    length: int | None  # the body's: by Content-Length (0 for none); None: chunked or to the close
    chunked: bool
    keep_alive: bool  # the connection may take another request once the body is read


def request_head(method: bytes, target: bytes, headers: Sequence[tuple[bytes, bytes]]) -> bytes:
    """The request line and headers (framing headers included by the caller), CRLF-ended.
    ProtocolError when a part holds a line break or NUL (one request would be two)."""
    lines = [b"%s %s HTTP/1.1" % (method, target)]
    lines += [k + b": " + v for k, v in headers]
    head = _CRLF.join(lines) + _CRLF + _CRLF
    breaks = len(lines) + 1
    if head.count(b"\n") != breaks or head.count(b"\r") != breaks or b"\0" in head:
        raise ProtocolError("a line break or NUL in the request's head")
    return head


def chunk(data: bytes) -> bytes:
    """`data` as one chunk of a chunked body (an empty one would end it: not sent)."""
    return b"%x\r\n%s\r\n" % (len(data), data) if data else b""


LAST_CHUNK = b"0\r\n\r\n"


def _tokens(value: bytes) -> set[bytes]:
    return {t.strip().lower() for t in value.split(b",") if t.strip()}


def _parse(head: bytes, method: bytes) -> Answer:
    status_line, *fields = head.split(_CRLF)
    version, _, rest = status_line.partition(b" ")
    code = rest[:3]
    if version not in (b"HTTP/1.1", b"HTTP/1.0") or len(code) != 3 or not code.isdigit():
        raise ProtocolError(f"not an HTTP/1.1 status line: {status_line[:40]!r}")
    status = int(code)
    headers: list[tuple[bytes, bytes]] = []
    lengths: set[bytes] = set()
    codings: list[bytes] = []
    connection: set[bytes] = set()
    for line in fields:
        name, colon, value = line.partition(b":")
        value = value.strip()
        if not colon or not name or _NOT_TOKEN.search(name) or _NOT_VALUE.search(value):
            raise ProtocolError(f"not a header line: {line[:40]!r}")
        headers.append((name, value))
        lowered = name.lower()
        if lowered == b"content-length":
            lengths |= _tokens(value)
        elif lowered == b"transfer-encoding":
            codings += [t.strip().lower() for t in value.split(b",") if t.strip()]
        elif lowered == b"connection":
            connection |= _tokens(value)
    if version == b"HTTP/1.1":
        keep_alive = b"close" not in connection
    else:
        keep_alive = b"keep-alive" in connection
    if method == b"HEAD" or status in NO_BODY or 100 <= status < 200:
        return Answer(status, headers, 0, False, keep_alive)
    if codings:  # it wins over a Content-Length, which then makes the connection suspect
        chunked = codings[-1] == b"chunked"
        reuse = keep_alive and chunked and not lengths
        return Answer(status, headers, None, chunked, reuse)
    if lengths:
        if len(lengths) != 1 or not next(iter(lengths)).isdigit():
            raise ProtocolError("a bad Content-Length")
        return Answer(status, headers, int(next(iter(lengths))), False, keep_alive)
    return Answer(status, headers, None, False, False)  # to the close


async def read_answer(reader: asyncio.StreamReader, method: bytes) -> Answer:
    """The worker's final answer's head (1xx skipped). IncompleteReadError when the
    connection ends before one."""
    while True:
        try:
            head = await reader.readuntil(_CRLF + _CRLF)
        except asyncio.LimitOverrunError:
            raise ProtocolError("an answer's head over 64 KiB") from None
        answer = _parse(head[:-4], method)
        if answer.status == 101:
            raise ProtocolError("101 to a request that asked for no upgrade")
        if answer.status >= 200:
            return answer


async def _size_line(reader: asyncio.StreamReader) -> int:
    try:
        line = await reader.readuntil(_CRLF)
    except asyncio.LimitOverrunError:
        raise ProtocolError("a chunk's size line over 64 KiB") from None
    size = line[:-2].partition(b";")[0].strip()  # chunk extensions dropped
    try:
        return int(size, 16)
    except ValueError:
        raise ProtocolError(f"a bad chunk size: {size[:20]!r}") from None


async def body(reader: asyncio.StreamReader, answer: Answer) -> AsyncIterator[bytes]:
    """The answer's body, in parts as they come (of at most READ_SIZE). IncompleteReadError
    when the connection ends before its end (a body to the close ends there)."""
    if answer.length is not None:
        left = answer.length
        while left:
            part = await reader.read(min(left, READ_SIZE))
            if not part:
                raise asyncio.IncompleteReadError(b"", left)
            left -= len(part)
            yield part
    elif answer.chunked:
        while size := await _size_line(reader):
            while size:
                part = await reader.read(min(size, READ_SIZE))
                if not part:
                    raise asyncio.IncompleteReadError(b"", size)
                size -= len(part)
                yield part
            if await reader.readexactly(2) != _CRLF:
                raise ProtocolError("a chunk not ended by CRLF")
        while await reader.readuntil(_CRLF) != _CRLF:  # trailers: not passed on
            pass
    else:
        while part := await reader.read(READ_SIZE):
            yield part
