"""The proxy's way to a worker (proxy/forward.py, http1.py, pool.py): HTTP/1.1 framing read
from plain bytes; through the proxy as the agent serves it, bodies of every framing streamed
both ways, kept connections reused (and one the worker closed replaced), a worker that fails
answered 502, a caller that goes away ending the worker's connection. The workers are raw
asyncio servers on unix sockets, so that they can misbehave as uvicorn would not."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import httpx
import pytest
from gpufleet_contracts.serving import ROUTES_HEALTH_PATH
from gpufleet_node_agent.proxy import forward, http1

from .proxykit import (
    Scheduler,
    endpoint_worker,
    listening,
    running_proxy,
    short_dir,
    socket_of,
)

HOST = "j1.localhost:8480"


def reader_of(data: bytes) -> asyncio.StreamReader:
    r = asyncio.StreamReader(limit=http1.MAX_HEAD)
    r.feed_data(data)
    r.feed_eof()
    return r


async def read(data: bytes, method: bytes = b"GET") -> tuple[http1.Answer, bytes]:
    r = reader_of(data)
    answer = await http1.read_answer(r, method)
    return answer, b"".join([p async for p in http1.body(r, answer)])


# --- framing, from plain bytes ----------------------------------------------------------------


async def test_an_answers_body_is_read_as_its_framing_says() -> None:
    a, body = await read(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloEXTRA")
    assert (a.status, a.length, a.keep_alive, body) == (200, 5, True, b"hello")
    chunked = b"4;ext=1\r\nwiki\r\n5\r\npedia\r\n0\r\nx-trailer: 1\r\n\r\n"
    a, body = await read(b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked)
    assert (a.status, a.chunked, a.keep_alive, body) == (201, True, True, b"wikipedia")
    a, body = await read(b"HTTP/1.1 200 OK\r\n\r\nuntil the end")
    assert (a.length, a.keep_alive, body) == (None, False, b"until the end")
    a, body = await read(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n")
    assert (a.status, a.length, body) == (204, 0, b"")
    a, body = await read(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n", b"HEAD")
    assert (a.length, body) == (0, b"")


@pytest.mark.parametrize(
    ("head", "keep_alive"),
    [
        (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0", False),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 0", False),
        (b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 0", True),
        # both framings: chunked wins, and the connection is not trusted again
        (b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked", False),
    ],
)
async def test_a_connection_is_kept_only_when_the_answer_says_so(
    head: bytes, keep_alive: bool
) -> None:
    a = await http1.read_answer(reader_of(head + b"\r\n\r\n0\r\n\r\n"), b"GET")
    assert a.keep_alive is keep_alive


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/2 200 OK",
        b"HTTP/1.1 2xx OK",
        b"SSH-2.0-OpenSSH",
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1",
        b"HTTP/1.1 200 OK\r\nx-a: 1\r\n folded",
        b"HTTP/1.1 200 OK\r\nno colon",
        b"HTTP/1.1 200 OK\r\nx a: 1",
        b"HTTP/1.1 200 OK\r\nx-a: 1\x01",
        b"HTTP/1.1 101 Switching Protocols",
    ],
)
async def test_what_is_not_an_http11_answer_is_refused(head: bytes) -> None:
    with pytest.raises(http1.ProtocolError):
        await http1.read_answer(reader_of(head + b"\r\n\r\n"), b"GET")


async def test_a_body_cut_short_or_a_bad_chunk_is_an_error() -> None:
    with pytest.raises(asyncio.IncompleteReadError):
        await read(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort")
    with pytest.raises(asyncio.IncompleteReadError):
        await read(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\nshort")
    with pytest.raises(http1.ProtocolError):
        await read(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
    head = http1.request_head(b"POST", b"/a?b=1", [(b"host", b"j1"), (b"content-length", b"2")])
    assert head == b"POST /a?b=1 HTTP/1.1\r\nhost: j1\r\ncontent-length: 2\r\n\r\n"
    with pytest.raises(http1.ProtocolError):  # no line break may be smuggled into a request
        http1.request_head(b"GET", b"/", [(b"x-a", b"1\r\nx-b: 2")])


# --- through the proxy, to workers that misbehave -----------------------------------------------

Act = Callable[[bytes, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[bool]]


@dataclass
class RawWorker:
    """An HTTP/1.1 server on a unix socket: its health path answers 200; any other request
    (its head and its Content-Length or chunked body read) is answered by `act`, which says
    whether the connection takes another request."""

    act: Act
    connections: int = 0
    bodies: list[bytes] = field(default_factory=list)
    ended: asyncio.Event = field(default_factory=asyncio.Event)  # a connection was closed on it

    async def serve(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await r.readuntil(b"\r\n\r\n")
                line, *fields = head[:-4].split(b"\r\n")
                headers = dict(f.lower().split(b": ", 1) for f in fields)
                body = b""
                if headers.get(b"transfer-encoding") == b"chunked":
                    while size := int((await r.readuntil(b"\r\n"))[:-2], 16):
                        body += (await r.readexactly(size + 2))[:-2]
                    await r.readuntil(b"\r\n")
                else:
                    body = await r.readexactly(int(headers.get(b"content-length", b"0")))
                target = line.split(b" ")[1]
                if target == ROUTES_HEALTH_PATH.encode():
                    w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    continue
                self.bodies.append(body)
                if not await self.act(target, r, w):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            self.ended.set()
        finally:
            w.close()


@contextlib.asynccontextmanager
async def through_proxy(act: Act) -> AsyncIterator[tuple[RawWorker, httpx.AsyncClient]]:
    """A worker serving by `act`, the proxy in front of it on a port, a client of the proxy."""
    with short_dir() as root:
        w = endpoint_worker(root, "j1", "p1")
        worker = RawWorker(act)
        server = await asyncio.start_unix_server(worker.serve, socket_of(w))
        sched = Scheduler()
        auth = {"authorization": f"Bearer {sched.key_for('j1')}", "host": HOST}
        try:
            async with (
                running_proxy([w], sched, max_body=2**20) as proxy,
                listening(proxy.app) as port,
                httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=auth) as c,
            ):
                for _ in range(100):  # probed ready
                    if proxy.endpoints.pick("j1") is not None:
                        break
                    await asyncio.sleep(0.05)
                worker.connections = 0
                yield worker, c
        finally:
            server.close()


def answer(body: bytes, *, status: bytes = b"200 OK") -> bytes:
    return b"HTTP/1.1 %s\r\nContent-Length: %d\r\n\r\n%s" % (status, len(body), body)


async def by_target(target: bytes, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> bool:
    """/chunked, /big (over BUFFERED), /to-close, /cut (a body cut off), /garbage, /slow,
    /endless (chunks until the reader goes); anything else: its body's length."""
    if target == b"/chunked":
        w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nx-kind: chunked\r\n\r\n")
        for part in (b"first ", b"second ", b"third"):
            w.write(http1.chunk(part))
            await w.drain()
            await asyncio.sleep(0.01)
        w.write(http1.LAST_CHUNK)
    elif target == b"/big":
        w.write(answer(bytes(range(256)) * (3 * forward.BUFFERED // 256)))
    elif target == b"/to-close":
        w.write(b"HTTP/1.1 200 OK\r\n\r\nall of it")
        return False
    elif target in (b"/cut", b"/big-cut"):
        n = 100 if target == b"/cut" else 4 * forward.BUFFERED
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (n, b"x" * (n // 2)))
        return False
    elif target == b"/garbage":
        w.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
        return False
    elif target == b"/slow":
        await asyncio.sleep(2)
        w.write(answer(b"late"))
    elif target == b"/endless":
        w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        while True:
            w.write(http1.chunk(b"tick " * 1000))
            await w.drain()
            await asyncio.sleep(0.005)
    else:
        w.write(answer(b"ok"))
    await w.drain()
    return True


async def test_answers_of_every_framing_are_relayed_whole_on_kept_connections() -> None:
    async with through_proxy(by_target) as (worker, c):
        r = await c.get("/chunked")
        assert (r.status_code, r.content, r.headers["x-kind"]) == (
            200,
            b"first second third",
            "chunked",
        )
        r = await c.get("/big")
        assert r.content == bytes(range(256)) * (3 * forward.BUFFERED // 256)
        assert r.headers["content-length"] == str(len(r.content))
        assert (await c.get("/other")).status_code == 200
        assert worker.connections == 0  # the probe's kept connection took all three
        r = await c.get("/to-close")
        assert r.content == b"all of it"
        assert (await c.get("/other")).status_code == 200
        assert worker.connections == 1  # the one the worker closed was not used again


async def test_request_bodies_of_every_framing_reach_the_worker_whole() -> None:
    async def parts() -> AsyncIterator[bytes]:
        for i in range(5):
            yield bytes([i]) * 50_000

    async with through_proxy(by_target) as (worker, c):
        big = bytes(range(256)) * 1000  # more than one part of the caller's
        assert (await c.post("/a", content=big)).status_code == 200
        assert (await c.post("/b", content=parts())).status_code == 200  # chunked
        assert (await c.post("/c", content=b"small")).status_code == 200
        assert worker.bodies == [big, b"".join(bytes([i]) * 50_000 for i in range(5)), b"small"]


async def test_a_kept_connection_the_worker_closes_as_a_request_goes_is_replaced() -> None:
    # The writers themselves, kept alive: an id() of a collected one can come back for a
    # new connection, which then looked answered already (a flaky 502).
    answered: list[asyncio.StreamWriter] = []

    async def once(target: bytes, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> bool:
        if any(w is seen for seen in answered):  # its second request: closed without a
            return False  # word, as a server whose keep-alive ran out just then does
        answered.append(w)
        w.write(answer(b"fine"))
        await w.drain()
        return True

    async with through_proxy(once) as (worker, c):
        for _ in range(3):
            r = await c.post("/x", content=b"body")
            assert (r.status_code, r.content) == (200, b"fine")
        assert worker.connections == 2  # the 2nd and 3rd sent again, each on a new one
        assert worker.bodies == [b"body"] * 5


@pytest.mark.parametrize("target", ["/cut", "/garbage", "/slow"])
async def test_a_worker_that_fails_before_its_answer_is_relayed_is_502(
    target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(forward, "READ_S", 0.5)
    async with through_proxy(by_target) as (_, c):
        r = await c.get(target)
        assert (r.status_code, r.json()) == (502, {"detail": "the endpoint's answer broke off"})
        assert (await c.get("/other")).status_code == 200  # and the next one goes through


async def test_an_answer_cut_midway_is_cut_for_the_caller_too() -> None:
    async with through_proxy(by_target) as (_, c):
        with pytest.raises(httpx.RemoteProtocolError):
            await c.get("/big-cut")


async def test_a_caller_that_goes_away_ends_the_workers_connection() -> None:
    async with through_proxy(by_target) as (worker, c):
        async with c.stream("GET", "/endless") as r:
            assert r.status_code == 200
            async for _ in r.aiter_bytes():
                break
        await c.aclose()  # the caller's connection closed mid-answer
        await asyncio.wait_for(worker.ended.wait(), 5)
