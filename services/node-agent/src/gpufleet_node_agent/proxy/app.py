"""The proxy's HTTP side: one origin per job (`<job>.localhost:8480`), each request decided
in this order, and nothing of the job told before its key opens it:

1. the Host names no job this node serves now (no worker of it here that has not ended,
   ready or not; a Host not of the proxy's form; an absolute-form target's own host is
   never looked at): 404 `{"detail": "not found"}`;
2. no `Authorization: Bearer` key: 401 with `WWW-Authenticate: Bearer`; a malformed key,
   or one the scheduler does not know (or revoked): 401; a live key of another endpoint:
   404, as for a job not here; the control plane not answering: 503 with Retry-After;
3. no worker of the job ready yet (its image, data or process still starting): the request
   is held until one is, up to `hold_s`, then 503 with `Retry-After: 5`;
4. forwarded to a ready worker's socket (in turn, when the job has several here), both
   bodies streamed; a request body over `max_body` is 413.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

import httpcore
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from . import upstream
from .auth import Unavailable, Verdicts, presented
from .hosts import UrlTemplate
from .served import Endpoints, Served

log = logging.getLogger("gpufleet.node_agent.proxy")

HOLD_S = 60.0
RETRY_AFTER_S = 5
MAX_BODY = 100 * 2**20  # a request's body, at most

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class TooLarge(Exception):
    pass


def not_found() -> Response:
    return JSONResponse({"detail": "not found"}, status_code=404)


def unauthorized(detail: str) -> Response:
    return JSONResponse({"detail": detail}, status_code=401, headers={"WWW-Authenticate": "Bearer"})


def unavailable(detail: str) -> Response:
    return JSONResponse(
        {"detail": detail}, status_code=503, headers={"Retry-After": str(RETRY_AFTER_S)}
    )


class ProxyApp:
    """An ASGI app (uvicorn runs it: server.py)."""

    def __init__(
        self,
        endpoints: Endpoints,
        verdicts: Verdicts,
        template: UrlTemplate,
        *,
        hold_s: float = HOLD_S,
        max_body: int = MAX_BODY,
    ) -> None:
        self.endpoints = endpoints
        self.verdicts = verdicts
        self.template = template
        self.hold_s = hold_s
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan (off in server.py), websockets: not served
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
            return
        request = Request(scope, receive)
        response = await self.decide(request)
        await response(scope, receive, send)

    async def decide(self, request: Request) -> Response:
        host = request.headers.get("host")
        job_id = self.template.job_of(host)
        if job_id is None or not self.endpoints.of(job_id):
            return not_found()
        key = presented(request.headers.get("authorization"))
        if key is None:
            return unauthorized("an endpoint key is required (Authorization: Bearer gfk_...)")
        if key is False:
            return unauthorized("not an endpoint key")
        try:
            verdict = await self.verdicts.verdict(job_id, key)
        except Unavailable as exc:
            log.warning("endpoint %s: key not checked: %s", job_id, exc)
            return unavailable("the control plane did not answer; try again")
        if verdict == "unknown":
            return unauthorized("unknown or revoked key")
        if verdict != "open":
            return not_found()
        served = await self._ready(job_id)
        if served is None:
            if not self.endpoints.of(job_id):  # its workers ended meanwhile
                return not_found()
            held = self.endpoints.of(job_id)[0]
            held.meter.answered(503)
            return unavailable("the endpoint is starting; try again")
        return await self.forward(request, served, host or "")

    async def _ready(self, job_id: str) -> Served | None:
        """A ready worker of the job, waiting for one up to hold_s; None past it."""
        deadline = time.monotonic() + self.hold_s
        while True:
            served = self.endpoints.pick(job_id)
            if served is not None or not self.endpoints.of(job_id):
                return served
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            changed = self.endpoints.changed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), timeout=min(left, 1.0))

    async def forward(self, request: Request, served: Served, host: str) -> Response:
        target = request.scope.get("raw_path") or request.url.path.encode()
        if not target.startswith(b"/"):  # an absolute-form target: only its path is the job's
            return JSONResponse({"detail": "bad request target"}, status_code=400)
        query = request.scope.get("query_string") or b""
        if query:
            target += b"?" + query
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body:
            return JSONResponse({"detail": "request body too large"}, status_code=413)
        client = request.client.host if request.client else ""
        headers = upstream.request_headers(
            request.scope["headers"], client=client, proto=self.template.scheme, host=host
        )
        meter = served.meter
        sent = 0

        async def body() -> AsyncIterator[bytes]:
            nonlocal sent
            async for chunk in request.stream():
                sent += len(chunk)
                if sent > self.max_body:
                    raise TooLarge
                meter.moved(bytes_in=len(chunk))
                yield chunk

        has_body = declared not in (None, "0") or "transfer-encoding" in request.headers
        if has_body and declared is None:  # the caller's chunks: chunked to the worker too
            headers.append((b"transfer-encoding", b"chunked"))
        outgoing = httpcore.Request(
            request.method.encode(),
            httpcore.URL(scheme=b"http", host=b"worker", port=None, target=target),
            headers=headers,
            content=body() if has_body else None,
            extensions={"timeout": dict(upstream.TIMEOUTS)},
        )
        try:
            answer = await served.pool.handle_async_request(outgoing)
        except TooLarge:
            meter.answered(413)
            return JSONResponse({"detail": "request body too large"}, status_code=413)
        except ClientDisconnect:
            return Response(status_code=499)
        except httpcore.ConnectError:
            self.endpoints.unready(served)  # probed again; the next request is held
            meter.answered(503)
            return unavailable("the endpoint is not answering; try again")
        except (httpcore.TimeoutException, httpcore.NetworkError, httpcore.ProtocolError) as exc:
            meter.answered(502)
            log.info("endpoint %s: %s", served.worker.key, type(exc).__name__)
            return JSONResponse({"detail": "the endpoint's answer broke off"}, status_code=502)
        self.endpoints.answered(served)
        meter.answered(answer.status)

        async def relayed() -> AsyncIterator[bytes]:
            try:
                async for chunk in answer.aiter_stream():
                    meter.moved(bytes_out=len(chunk))
                    yield chunk
            except (httpcore.NetworkError, httpcore.ProtocolError, httpcore.TimeoutException):
                return
            finally:
                await answer.aclose()

        response = StreamingResponse(relayed(), status_code=answer.status)
        response.raw_headers = upstream.response_headers(answer.headers)
        return response
