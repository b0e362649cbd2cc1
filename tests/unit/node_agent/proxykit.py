"""For the endpoint proxy's tests: real HTTP servers on unix sockets standing for endpoint
workers (uvicorn, as the route server is), the workers as the manager holds them, and the
scheduler's verdicts on keys (its rule: a key opens its own job, is `elsewhere` for another,
`unknown` otherwise)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats.errors
import uvicorn
from gpufleet_contracts.serving import (
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
from gpufleet_node_agent.steps.serve import SERVE_DIR, SOCKET
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


@dataclass
class Seen:
    method: str
    target: str
    headers: dict[str, str]
    body: bytes
    complete: bool  # False: the caller went away before the end of its body


@dataclass
class Upstream:
    """An HTTP server on a unix socket: its health path answers 200 once `ready`; `/boom`
    answers 500; anything else echoes what it got (as JSON) and names the server."""

    path: Path
    name: str = "w"
    ready: bool = True
    seen: list[Seen] = field(default_factory=list)
    _server: uvicorn.Server | None = None
    _task: asyncio.Task[None] | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
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
        if scope["path"] == ROUTES_HEALTH_PATH:
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
) -> AsyncIterator[Proxy]:
    """The proxy's app over `workers` (the list may change), its probes running."""
    endpoints = endpoints or Endpoints(
        lambda: list(workers), minion_id="n1", publisher=None, template=TEMPLATE, uid=uid
    )
    app = ProxyApp(
        endpoints, Verdicts("n1", scheduler.request), TEMPLATE, hold_s=hold_s, max_body=max_body
    )
    task = asyncio.create_task(endpoints.run())
    try:
        yield Proxy(app, endpoints, workers, scheduler)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
