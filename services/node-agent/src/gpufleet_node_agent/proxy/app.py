"""The proxy's HTTP side: one origin per job (`<job>.localhost:8480`), each request (or
websocket) decided in this order, and nothing of the job told before its key or token
opens it:

1. the Host names no job this node serves now (no worker of it here that has not ended,
   ready or not; a Host not of the proxy's form; an absolute-form target's own host is
   never looked at): 404 `{"detail": "not found"}`;
2. an endpoint: no `Authorization: Bearer` key: 401 with `WWW-Authenticate: Bearer`; a
   malformed key, or one the scheduler does not know (or revoked): 401; a live key of
   another endpoint: 404, as for a job not here; the control plane not answering: 503 with
   Retry-After. A notebook: no token shown (`?token=`, `Authorization: token|Bearer`, the
   proxy's cookie), or none that is its own: 401;
3. no worker of the job ready yet (its image, data or process still starting): the request
   is held until one is, up to `hold_s`, then 503 with `Retry-After: 5`;
4. forwarded to a ready worker's socket (in turn, when the job has several here) over a
   kept-alive connection (forward.py), both bodies streamed; a request body over
   `max_body` is 413; the worker not answering is 503 (it is probed again), its answer
   failing before any of it was relayed 502. A notebook's answer to a request
   whose query showed its token sets the proxy's cookie (NOTEBOOK_COOKIE, holding the
   token), so that the browser shows it on its later requests. A websocket is relayed
   (websocket.py); one refused in 1-3 gets that HTTP answer instead of its handshake.

On a listener of one job (an endpoint's or notebook's reserved port: reserved.py) the job
is the listener's (`JOB_SCOPE` in the ASGI scope, which the server makes and no caller can
set: a header is never a key of the scope), not the Host's; 2-4 are the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from gpufleet_contracts.serving import NOTEBOOK_COOKIE
from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, Response

from . import forward, upstream, websocket
from .auth import Unavailable, Verdicts, notebook_tokens, presented, token_opens
from .hosts import UrlTemplate
from .pool import Unreachable
from .served import Endpoints, Served

log = logging.getLogger("gpufleet.node_agent.proxy")

HOLD_S = 60.0
RETRY_AFTER_S = 5
MAX_BODY = 100 * 2**20  # a request's body (a websocket's message), at most
# What a cookie's value may hold (RFC 6265 cookie-octet): a token with anything else is not
# put in one (it is shown on each request then).
_COOKIE_OCTETS = frozenset(chr(c) for c in range(0x21, 0x7F)) - set('",;\\')
JOB_SCOPE = "gpufleet.job"  # the job of a listener of one job (reserved.py), served over http

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


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
        if scope["type"] == "http":
            request = Request(scope, receive)
            answer: Served | Response | None = await self.open(request)
            if isinstance(answer, Served):
                answer = await self.forward(request, answer, send)
            if answer is not None:
                await answer(scope, receive, send)
        elif scope["type"] == "websocket":
            if (await receive())["type"] != "websocket.connect":
                return
            conn = HTTPConnection(scope)
            opened = await self.open(conn)
            if not isinstance(opened, Served):
                await websocket.refuse(scope, receive, send, opened)
                return
            headers = self.headers(conn, opened)
            await websocket.relay(
                scope,
                receive,
                send,
                opened,
                headers,
                host=conn.headers.get("host") or "",
                uid=self.endpoints.uid,
                max_size=self.max_body,
            )
        # lifespan: off (server.py)

    async def open(self, conn: HTTPConnection) -> Served | Response:
        """The ready worker a request (or websocket) goes to, or the answer it gets instead."""
        fixed = conn.scope.get(JOB_SCOPE)
        job_id = fixed if fixed is not None else self.template.job_of(conn.headers.get("host"))
        workers = self.endpoints.of(job_id) if job_id is not None else []
        if job_id is None or not workers:
            return not_found()
        if workers[0].notebook:
            refused = self._token_refusal(conn, workers)
        else:
            refused = await self._key_refusal(conn, job_id)
        if refused is not None:
            return refused
        served = await self._ready(job_id)
        if served is None:
            if not self.endpoints.of(job_id):  # its workers ended meanwhile
                return not_found()
            held = self.endpoints.of(job_id)[0]
            held.meter.answered(503)
            return unavailable(f"the {_kind(held)} is starting; try again")
        return served

    async def _key_refusal(self, conn: HTTPConnection, job_id: str) -> Response | None:
        """An endpoint's caller: None when its key opens the job."""
        key = presented(conn.headers.get("authorization"))
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
        return None

    @staticmethod
    def _token_refusal(conn: HTTPConnection, workers: list[Served]) -> Response | None:
        """A notebook's caller: None when a token it shows is the notebook's."""
        shown = notebook_tokens(
            conn.query_params.get("token"),
            conn.headers.get("authorization"),
            conn.cookies.get(NOTEBOOK_COOKIE),
        )
        if not shown:
            return unauthorized(
                "the notebook's token is required (?token=..., or Authorization: token ...)"
            )
        digests = {s.token_sha256 for s in workers}
        if any(token_opens(t, d) for t in shown for d in digests):
            return None
        return unauthorized("not the notebook's token")

    def scheme(self, conn: HTTPConnection) -> str:
        """How the caller reached the proxy: the template's scheme, or http on a listener of
        one job."""
        return "http" if JOB_SCOPE in conn.scope else self.template.scheme

    def headers(self, conn: HTTPConnection, served: Served) -> upstream.Headers:
        """What the worker gets of the caller's headers (upstream.request_headers)."""
        client = conn.client.host if conn.client else ""
        return upstream.request_headers(
            conn.scope["headers"],
            client=client,
            proto=self.scheme(conn),
            host=conn.headers.get("host") or "",
            credentials=served.notebook,
        )

    def set_cookie(self, request: Request, served: Served) -> bytes | None:
        """The proxy's cookie for a notebook's answer, when the query showed its token."""
        if not served.notebook:
            return None
        token = request.query_params.get("token")
        if not token or not token_opens(token, served.token_sha256):
            return None
        if not set(token) <= _COOKIE_OCTETS:
            return None
        secure = "; Secure" if self.scheme(request) == "https" else ""
        return f"{NOTEBOOK_COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict{secure}".encode()

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

    async def forward(self, request: Request, served: Served, send: Send) -> Response | None:
        """The worker's answer relayed to the caller (forward.py); or the answer the caller
        gets instead (400, 413, 502, 503), or None when it went away."""
        target = request.scope.get("raw_path") or request.url.path.encode()
        if not target.startswith(b"/"):  # an absolute-form target: only its path is the job's
            return JSONResponse({"detail": "bad request target"}, status_code=400)
        query = request.scope.get("query_string") or b""
        if query:
            target += b"?" + query
        declared = request.headers.get("content-length")
        length = int(declared) if declared is not None and declared.isdigit() else None
        if length is not None and length > self.max_body:
            return JSONResponse({"detail": "request body too large"}, status_code=413)
        headers = [h for h in self.headers(request, served) if h[0].lower() != b"content-length"]
        has_body = declared not in (None, "0") or "transfer-encoding" in request.headers
        outgoing = forward.Outgoing(request.method.encode(), target, headers, has_body, length)
        meter = served.meter
        try:
            ex = await forward.exchange(
                served.pool, outgoing, request.receive, meter.moved, self.max_body
            )
        except forward.TooLarge:
            meter.answered(413)
            return JSONResponse({"detail": "request body too large"}, status_code=413)
        except forward.CallerGone:
            return None
        except Unreachable as exc:
            log.info("endpoint %s: %s", served.worker.key, exc)
            self.endpoints.unready(served)  # probed again; the next request is held
            meter.answered(503)
            return unavailable(f"the {_kind(served)} is not answering; try again")
        except forward.BrokeOff as exc:
            meter.answered(502)
            log.info("endpoint %s: %s", served.worker.key, exc)
            return JSONResponse({"detail": "the endpoint's answer broke off"}, status_code=502)
        self.endpoints.answered(served)
        meter.answered(ex.answer.status)
        back = upstream.response_headers(ex.answer.headers)
        cookie = self.set_cookie(request, served)
        if cookie is not None:
            back.append((b"set-cookie", cookie))
        if ex.body is not None:
            meter.moved(bytes_out=len(ex.body))
            await forward.answer(send, ex.answer.status, back, ex.body)
        elif not await forward.stream(served.pool, ex, back, request.receive, send, meter.moved):
            log.info("endpoint %s: its answer broke off midway", served.worker.key)
        return None


def _kind(s: Served) -> str:
    return "notebook" if s.notebook else "endpoint"
