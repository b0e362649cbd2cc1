"""For the endpoint proxy's tests: real HTTP servers on unix sockets standing for endpoint
and notebook workers (uvicorn, as the route server is; a websocket echo too), the workers as
the manager holds them (a notebook's with its token's digest kept), and the scheduler's
verdicts on keys (its rule: a key opens its own job, is `elsewhere` for another, `unknown`
otherwise)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats.errors
import uvicorn
from gpufleet_contracts.serving import (
    NOTEBOOK_COMMAND,
    NOTEBOOK_HEALTH_PATH,
    NOTEBOOK_TOKEN_ENV,
    ROUTES_HEALTH_PATH,
    EndpointKeyVerdict,
    Serving,
    VerifyEndpointKey,
    key_digest,
    parse_key,
)
from gpufleet_node_agent.proxy.app import ProxyApp
from gpufleet_node_agent.proxy.auth import Verdicts
from gpufleet_node_agent.proxy.hosts import UrlTemplate
from gpufleet_node_agent.proxy.served import Endpoints
from gpufleet_node_agent.proxy.server import ProxyServer
from gpufleet_node_agent.steps.serve import SERVE_DIR, SOCKET, TOKEN_FILE, kept_token
from gpufleet_node_agent.worker.spec import WorkerSpec
from gpufleet_node_agent.worker.workdir import Worker

TEMPLATE = UrlTemplate.parse("http://{job}.localhost:8480")


def new_key() -> str:
    return f"gfk_{secrets.token_hex(6)}_{secrets.token_urlsafe(32)}"


@contextlib.contextmanager
def short_dir() -> Iterator[Path]:
    """A directory with a short path: a unix socket's address holds 108 bytes."""
    d = Path(tempfile.mkdtemp(prefix="gfp-", dir="/tmp"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def endpoint_worker(root: Path, job_id: str, placement: str, worker: int = 0) -> Worker:
    d = root / placement
    (d / SERVE_DIR).mkdir(parents=True)
    spec = WorkerSpec(
        placement_id=placement,
        job_id=job_id,
        worker=worker,
        serving=Serving(kind="routes", health_path=ROUTES_HEALTH_PATH),
    )
    return Worker(spec, d)


def notebook_worker(root: Path, job_id: str, placement: str, token: str) -> Worker:
    """A notebook's worker, its token's digest kept as the manager keeps it."""
    d = root / placement
    (d / SERVE_DIR).mkdir(parents=True)
    kept = kept_token({NOTEBOOK_TOKEN_ENV: token})
    assert kept is not None
    (d / TOKEN_FILE).write_text(json.dumps(kept))
    spec = WorkerSpec(
        placement_id=placement,
        job_id=job_id,
        worker=0,
        command=NOTEBOOK_COMMAND,
        serving=Serving(kind="notebook", health_path=NOTEBOOK_HEALTH_PATH),
    )
    return Worker(spec, d)


def new_token() -> str:
    return secrets.token_urlsafe(32)


@dataclass
class Seen:
    method: str
    target: str
    headers: dict[str, str]
    body: bytes
    complete: bool  # False: the caller went away before the end of its body


@dataclass
class Upstream:
    """An HTTP server on a unix socket: its health paths (a route server's, Jupyter's) answer
    200 once `ready`; `/boom`
    answers 500; anything else echoes what it got (as JSON) and names the server. A
    websocket is echoed (`/ws-refused`: refused; `/ws-bye`: closed by it with 4001 after its
    first message); what its handshakes came with is in `sockets`, how each ended in
    `closed`."""

    path: Path
    name: str = "w"
    ready: bool = True
    seen: list[Seen] = field(default_factory=list)
    sockets: list[Seen] = field(default_factory=list)
    closed: list[int] = field(default_factory=list)  # the callers' close codes
    _server: uvicorn.Server | None = None
    _task: asyncio.Task[None] | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":
            await self.echo(scope, receive, send)
            return
        if scope["type"] != "http":
            return
        body, complete = b"", True
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                complete = False
                break
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        target = scope["raw_path"].decode() + (
            "?" + scope["query_string"].decode() if scope["query_string"] else ""
        )
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        if scope["path"] in (ROUTES_HEALTH_PATH, NOTEBOOK_HEALTH_PATH):
            status, answer = (200 if self.ready else 503), b'{"status": "ok"}'
        else:
            self.seen.append(Seen(scope["method"], target, headers, body, complete))
            status = 500 if scope["path"] == "/boom" else 200
            answer = json.dumps(
                {"name": self.name, "target": target, "headers": headers, "body": len(body)}
            ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"connection", b"keep-alive, x-hop"),
                    (b"x-hop", b"1"),
                    (b"x-from-worker", self.name.encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": answer})

    async def echo(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()  # websocket.connect
        target = scope["raw_path"].decode() + (
            "?" + scope["query_string"].decode() if scope["query_string"] else ""
        )
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        self.sockets.append(Seen("WS", target, headers, b"", True))
        if scope["path"] == "/ws-refused":  # as Jupyter refuses another Origin
            await send({"type": "websocket.http.response.start", "status": 403, "headers": []})
            await send({"type": "websocket.http.response.body", "body": b"blocked"})
            return
        offered = scope.get("subprotocols") or []
        await send({"type": "websocket.accept", "subprotocol": offered[-1] if offered else None})
        while True:
            msg = await receive()
            if msg["type"] == "websocket.disconnect":
                self.closed.append(int(msg.get("code") or 0))
                return
            if scope["path"] == "/ws-bye":
                await send({"type": "websocket.close", "code": 4001, "reason": "bye"})
                return
            out = {"type": "websocket.send"}
            if msg.get("text") is not None:
                out["text"] = f"{self.name}:{msg['text']}"
            else:
                out["bytes"] = self.name.encode() + b":" + msg["bytes"]
            await send(out)

    async def start(self) -> Upstream:
        config = uvicorn.Config(self, uds=str(self.path), log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started:  # noqa: ASYNC110 - uvicorn's flag
            await asyncio.sleep(0.01)
        return self

    async def stop(self) -> None:
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await self._task


def socket_of(w: Worker) -> Path:
    return w.dir / SERVE_DIR / SOCKET


@dataclass
class Scheduler:
    """VerifyEndpointKey answered as the scheduler's rule says, for the keys it knows."""

    keys: dict[str, str] = field(default_factory=dict)  # key -> its job
    cache_s: int = 5
    down: bool = False
    asked: int = 0

    def key_for(self, job_id: str) -> str:
        key = new_key()
        self.keys[key] = job_id
        return key

    async def request(self, subject: str, body: bytes) -> bytes:
        self.asked += 1
        if self.down:
            raise nats.errors.TimeoutError
        asked = VerifyEndpointKey.model_validate_json(body)
        verdict = "unknown"
        for key, job in self.keys.items():
            parsed = parse_key(key)
            assert parsed is not None
            if parsed[0] == asked.key_id and key_digest(parsed[1]) == asked.digest:
                verdict = "open" if job == asked.job_id else "elsewhere"
        return EndpointKeyVerdict(verdict=verdict, cache_s=self.cache_s).model_dump_json().encode()


@dataclass
class Proxy:
    app: ProxyApp
    endpoints: Endpoints
    workers: list[Worker]
    scheduler: Scheduler


@contextlib.asynccontextmanager
async def running_proxy(
    workers: list[Worker],
    scheduler: Scheduler,
    *,
    hold_s: float = 5.0,
    max_body: int = 2**20,
    uid: int | None = None,
    endpoints: Endpoints | None = None,
    template: UrlTemplate = TEMPLATE,
) -> AsyncIterator[Proxy]:
    """The proxy's app over `workers` (the list may change), its probes running."""
    endpoints = endpoints or Endpoints(
        lambda: list(workers), minion_id="n1", publisher=None, template=template, uid=uid
    )
    app = ProxyApp(
        endpoints, Verdicts("n1", scheduler.request), template, hold_s=hold_s, max_body=max_body
    )
    task = asyncio.create_task(endpoints.run())
    try:
        yield Proxy(app, endpoints, workers, scheduler)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.asynccontextmanager
async def listening(app: ProxyApp) -> AsyncIterator[int]:
    """`app` served as the agent serves it (uvicorn, websockets too), on a port of 127.0.0.1."""
    port = free_port()
    server = ProxyServer(app, f"127.0.0.1:{port}")
    await server.start()
    try:
        yield port
    finally:
        await server.stop()


async def raw(port: int, request: str) -> tuple[int, str, str]:
    """Write `request` to 127.0.0.1:`port` as it is (no client's checks): the answer's
    status, head and body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request.encode())
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    text = head.decode(errors="replace")
    return int(text.split(" ", 2)[1]), text, body.decode(errors="replace")
