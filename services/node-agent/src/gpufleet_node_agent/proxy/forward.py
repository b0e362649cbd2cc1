"""A request relayed to a worker over one of its keep-alive connections (pool.py) and its
answer back to the caller: ASGI's receive and send on the caller's side, HTTP/1.1 on the
worker's (http1.py); both bodies streamed and metered. A request body whole in its first
part goes with its head in one write; an answer body of a known length up to BUFFERED is
read whole and sent with its head, larger or unframed ones are relayed part by part while a
watcher closes the worker's connection if the caller goes away."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from . import http1
from .pool import Connection, Pool

READ_S = 600.0  # an inference may take minutes; the caller may give up earlier
WRITE_S = 600.0
BUFFERED = 64 * 2**10

Headers = list[tuple[bytes, bytes]]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
Metered = Callable[[int, int], None]  # (bytes in, bytes out)

# How an exchange with a worker fails (after its connection was opened).
BROKE = (OSError, EOFError, TimeoutError, asyncio.LimitOverrunError, http1.ProtocolError)


class TooLarge(Exception):
    """The caller's body went past the limit."""


class CallerGone(Exception):
    """The caller went away before the end of its body."""


class BrokeOff(Exception):
    """The worker's answer failed (broke off, timed out, not HTTP) before any of it was sent
    to the caller."""


@dataclass(frozen=True)
class Outgoing:
    method: bytes
    target: bytes
    headers: Headers  # the worker's (upstream.request_headers), without framing headers
    has_body: bool
    declared: int | None  # the caller's Content-Length; None with a body: it is chunked


@dataclass(frozen=True)
class Exchanged:
    answer: http1.Answer
    body: bytes | None  # the whole body (its connection given back); None: to be streamed
    conn: Connection | None  # held while its body is streamed


async def _first(receive: Receive) -> tuple[bytes, bool]:
    """The first part of the caller's body and whether it is the whole."""
    msg = await receive()
    if msg["type"] == "http.disconnect":
        raise CallerGone
    return msg.get("body", b""), not msg.get("more_body", False)


def _head(out: Outgoing, first: bytes, whole: bool) -> bytes:
    if out.has_body and whole:
        framing = [(b"content-length", b"%d" % len(first))]
    elif out.has_body and out.declared is not None:
        framing = [(b"content-length", b"%d" % out.declared)]
    elif out.has_body:
        framing = [(b"transfer-encoding", b"chunked")]
    else:
        framing = []
    return http1.request_head(out.method, out.target, out.headers + framing)


async def _rest(
    conn: Connection, out: Outgoing, receive: Receive, metered: Metered, sent: int, limit: int
) -> None:
    """The caller's body after its first part, written as it comes."""
    chunked = out.declared is None
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise CallerGone
        data: bytes = msg.get("body", b"")
        sent += len(data)
        if sent > limit:
            raise TooLarge
        if out.declared is not None and sent > out.declared:
            raise http1.ProtocolError("a body longer than its Content-Length")
        metered(len(data), 0)
        conn.writer.write(http1.chunk(data) if chunked else data)
        async with asyncio.timeout(WRITE_S):
            await conn.writer.drain()
        if not msg.get("more_body"):
            break
    if chunked:
        conn.writer.write(http1.LAST_CHUNK)
    elif sent != out.declared:
        raise http1.ProtocolError("a body shorter than its Content-Length")


def _stale(exc: BaseException) -> bool:
    """The worker closed a kept connection as the request went (nothing of an answer came)."""
    if isinstance(exc, asyncio.IncompleteReadError):
        return not exc.partial
    return isinstance(exc, ConnectionError)


async def exchange(
    pool: Pool, out: Outgoing, receive: Receive, metered: Metered, limit: int
) -> Exchanged:
    """The request sent and the answer's head read (its body too, up to BUFFERED). TooLarge,
    CallerGone, pool.Unreachable, BrokeOff; a request whole in memory is sent again, once, on
    a new connection when a kept one turns out closed."""
    first, whole = await _first(receive) if out.has_body else (b"", True)
    if len(first) > limit:
        raise TooLarge
    metered(len(first), 0)
    head, size = _head(out, first, whole), len(first)
    if not whole and out.declared is None:
        first = http1.chunk(first)
    for again in (False, True):
        try:
            conn, reused = await pool.take()
        except TimeoutError:  # all its connections busy for POOL_S
            raise BrokeOff("no free connection") from None
        try:
            conn.writer.write(head + first)
            if not whole:
                await _rest(conn, out, receive, metered, size, limit)
            async with asyncio.timeout(READ_S):
                await conn.writer.drain()
                answer = await http1.read_answer(conn.reader, out.method)
                length = answer.length
                if length is not None and length <= BUFFERED:
                    body = await conn.reader.readexactly(length) if length else b""
                    pool.give_back(conn, keep=answer.keep_alive)
                    return Exchanged(answer, body, None)
            return Exchanged(answer, None, conn)
        except BROKE as exc:
            pool.discard(conn)
            if reused and whole and not again and _stale(exc):
                continue
            raise BrokeOff(type(exc).__name__) from exc
        except BaseException:
            pool.discard(conn)
            raise
    raise AssertionError("unreachable")


def _start(status: int, headers: Headers) -> MutableMapping[str, Any]:
    return {"type": "http.response.start", "status": status, "headers": headers}


async def answer(send: Send, status: int, headers: Headers, body: bytes) -> None:
    await send(_start(status, headers))
    await send({"type": "http.response.body", "body": body})


async def stream(
    pool: Pool,
    ex: Exchanged,
    headers: Headers,
    receive: Receive,
    send: Send,
    metered: Metered,
) -> bool:
    """The answer's body relayed part by part; False when it broke off (the caller's
    connection is then closed by the server: the app returns with the answer incomplete)."""
    conn = ex.conn
    assert conn is not None
    finished = False

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        if not finished:
            conn.close()  # the read below ends: nothing more is relayed for nobody

    watcher = asyncio.ensure_future(watch())
    try:
        await send(_start(ex.answer.status, headers))
        parts = http1.body(conn.reader, ex.answer)
        while True:
            async with asyncio.timeout(READ_S):
                part = await anext(parts, None)
            if part is None:
                break
            metered(0, len(part))
            await send({"type": "http.response.body", "body": part, "more_body": True})
    except BROKE:
        pool.discard(conn)
        return False
    except BaseException:
        pool.discard(conn)
        raise
    finally:
        finished = True
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await watcher
    pool.give_back(conn, keep=ex.answer.keep_alive)
    await send({"type": "http.response.body", "body": b""})
    return True


async def status_of(pool: Pool, target: bytes, headers: Headers) -> int:
    """GET `target` of the worker: its answer's status (the body read and dropped)."""
    out = Outgoing(b"GET", target, headers, has_body=False, declared=None)
    ex = await exchange(pool, out, _no_body, lambda i, o: None, 0)
    if ex.conn is not None:
        try:
            async for _ in http1.body(ex.conn.reader, ex.answer):
                pass
        except BaseException:
            pool.discard(ex.conn)
            raise
        pool.give_back(ex.conn, keep=ex.answer.keep_alive)
    return ex.answer.status


async def _no_body() -> MutableMapping[str, Any]:
    return {"type": "http.request", "body": b"", "more_body": False}
