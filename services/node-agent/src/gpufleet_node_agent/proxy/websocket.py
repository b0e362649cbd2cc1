"""A websocket through the proxy (a notebook's kernels, an endpoint's own), once app.py has
opened it: a websocket to the worker's socket (upstream.open_socket: the worker's own
socket, no link followed) asked with the caller's path, subprotocols and the headers an
HTTP request would take (Origin among them; a notebook's cookies and Authorization, less
the proxy's cookie); the caller's handshake accepted with the worker's subprotocol; then
each text or binary message relayed as it is, both ways, metered, until either end closes,
which closes the other with its code.

A refusal, before the handshake, is the HTTP answer app.py decided (401, 404, 503; a worker
refusing the handshake: its status), where the server can send one (ASGI's
`websocket.http.response`, which uvicorn has); else a close with 1008.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

from starlette.responses import JSONResponse, Response
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from . import upstream
from .served import Served

log = logging.getLogger("gpufleet.node_agent.proxy")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

# What the websocket client writes itself in its handshake: not taken from the caller's.
OWN_HEADERS = frozenset(
    {
        b"host",
        b"upgrade",
        b"connection",
        b"sec-websocket-key",
        b"sec-websocket-version",
        b"sec-websocket-extensions",
        b"sec-websocket-protocol",
        b"sec-websocket-accept",
    }
)
# Close codes an endpoint may send (RFC 6455 7.4); 1005 (none given) is sent as 1000, and
# 1006 (the connection dropped) and the rest as 1011.
SENDABLE = frozenset({1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014})


def sendable(code: int | None) -> int:
    if code is None or code == 1005:
        return 1000
    return code if code in SENDABLE or 3000 <= code < 5000 else 1011


async def refuse(scope: Scope, receive: Receive, send: Send, answer: Response) -> None:
    """Refuse a websocket before its handshake: with `answer` where the server can send it."""
    if "websocket.http.response" in (scope.get("extensions") or {}):
        await answer(scope, receive, send)
    else:
        await send({"type": "websocket.close", "code": 1008})


async def relay(
    scope: Scope,
    receive: Receive,
    send: Send,
    served: Served,
    headers: upstream.Headers,
    *,
    host: str,
    uid: int | None,
    max_size: int,
) -> None:
    """The caller's websocket (its `websocket.connect` received) relayed to `served`."""
    meter = served.meter
    target = scope.get("raw_path") or str(scope.get("path") or "/").encode()
    if not target.startswith(b"/"):
        await refuse(scope, receive, send, JSONResponse({"detail": "bad target"}, 400))
        return
    if scope.get("query_string"):
        target += b"?" + scope["query_string"]
    worker = await _connect(scope, receive, send, served, headers, host, target, uid, max_size)
    if worker is None:
        return
    meter.answered(101)
    try:
        await send({"type": "websocket.accept", "subprotocol": worker.subprotocol})
        await _both_ways(receive, send, worker, served)
    finally:
        await worker.close()


async def _connect(
    scope: Scope,
    receive: Receive,
    send: Send,
    served: Served,
    headers: upstream.Headers,
    host: str,
    target: bytes,
    uid: int | None,
    max_size: int,
) -> ClientConnection | None:
    """The websocket to the worker; None when there is none (the caller told why)."""
    meter = served.meter
    try:
        sock = await upstream.open_socket(Path(served.socket), uid)
    except OSError as exc:
        log.info("websocket to %s: %s", served.worker.key, exc)
        meter.answered(503)
        answer: Response = JSONResponse(
            {"detail": "the worker is not answering; try again"},
            status_code=503,
            headers={"Retry-After": "5"},
        )
        await refuse(scope, receive, send, answer)
        return None
    extra = [
        (k.decode("latin-1"), v.decode("latin-1"))
        for k, v in headers
        if k.lower() not in OWN_HEADERS
    ]
    # The URI names the caller's Host (what the client's Host header is made of: a
    # notebook's server checks the Origin against it); the connection is `sock`.
    uri = f"ws://{host}{target.decode('latin-1')}"
    try:
        return await connect(
            uri,
            sock=sock,
            subprotocols=scope.get("subprotocols") or None,
            additional_headers=extra,
            user_agent_header=None,
            compression=None,
            open_timeout=upstream.CONNECT_S,
            ping_interval=None,
            max_size=max_size,
        )
    except InvalidStatus as exc:  # the worker's own refusal: its status, passed on
        status = exc.response.status_code
        meter.answered(status)
        kind = exc.response.headers.get("Content-Type")
        answer = Response(bytes(exc.response.body or b""), status, media_type=kind)
        await refuse(scope, receive, send, answer)
    except (OSError, InvalidHandshake, TimeoutError, ValueError) as exc:
        log.info("websocket to %s: %s", served.worker.key, exc)
        meter.answered(502)
        answer = JSONResponse({"detail": "the worker's websocket failed"}, status_code=502)
        await refuse(scope, receive, send, answer)
    sock.close()
    return None


async def _both_ways(receive: Receive, send: Send, worker: ClientConnection, s: Served) -> None:
    """Messages relayed until either end closes; the other then closed with its code."""
    meter = s.meter

    async def from_caller() -> int:
        while True:
            msg = await receive()
            if msg["type"] == "websocket.disconnect":
                return int(msg.get("code") or 1005)
            if msg["type"] != "websocket.receive":
                continue
            if msg.get("text") is not None:
                text: str = msg["text"]
                meter.message(bytes_in=len(text.encode()))
                await worker.send(text)
            elif msg.get("bytes") is not None:
                data: bytes = msg["bytes"]
                meter.message(bytes_in=len(data))
                await worker.send(data)

    async def from_worker() -> None:
        async for message in worker:
            if isinstance(message, str):
                meter.message(bytes_out=len(message.encode()))
                await send({"type": "websocket.send", "text": message})
            else:
                meter.message(bytes_out=len(message))
                await send({"type": "websocket.send", "bytes": message})

    caller = asyncio.ensure_future(from_caller())
    upstream_side = asyncio.ensure_future(from_worker())
    try:
        await asyncio.wait({caller, upstream_side}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (caller, upstream_side):
            task.cancel()
        for task in (caller, upstream_side):
            with contextlib.suppress(asyncio.CancelledError, ConnectionClosed, Exception):
                await task
    if caller.done() and not caller.cancelled() and caller.exception() is None:
        await worker.close(code=sendable(caller.result()))  # the caller went: the worker too
        return
    code = sendable(worker.close_code) if worker.close_code is not None else 1011
    with contextlib.suppress(Exception):  # the caller may be gone as well
        await send({"type": "websocket.close", "code": code, "reason": worker.close_reason or ""})
