"""The node agent's endpoint proxy in a process of its own, as the agent serves it
(proxy/server.py: uvicorn in a plain asyncio loop, the agent's), in front of one endpoint
worker whose route server listens on `<worker dir>/serve/http.sock`. The scheduler's verdict
on the key is stubbed: `open`, kept 60 s (the most the scheduler allows); in production the
first request asks the scheduler over NATS and the next ones within `cache_s` find the
verdict cached, as here.

    python proxyproc.py --root /tmp/gfb-x --job j1 --listen 127.0.0.1:8480

Prints `ready` once it listens; runs until killed. Only what the agent's proxy does is here:
its other work (NATS, the watch rounds) does not share this loop.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from gpufleet_contracts.serving import ROUTES_HEALTH_PATH, EndpointKeyVerdict, Serving, ServingKind
from gpufleet_node_agent.proxy.app import ProxyApp
from gpufleet_node_agent.proxy.auth import Verdicts
from gpufleet_node_agent.proxy.hosts import UrlTemplate
from gpufleet_node_agent.proxy.served import Endpoints
from gpufleet_node_agent.proxy.server import ProxyServer
from gpufleet_node_agent.worker.spec import WorkerSpec
from gpufleet_node_agent.worker.workdir import Worker

PLACEMENT = "p1"
OPEN = EndpointKeyVerdict(verdict="open", cache_s=60).model_dump_json().encode()


async def scheduler(subject: str, body: bytes) -> bytes:
    """VerifyEndpointKey answered `open` (asked once: the verdict is then cached)."""
    return OPEN


def worker(root: Path, job_id: str) -> Worker:
    spec = WorkerSpec(
        placement_id=PLACEMENT,
        job_id=job_id,
        worker=0,
        serving=Serving(kind=ServingKind.routes, health_path=ROUTES_HEALTH_PATH),
    )
    return Worker(spec, root / PLACEMENT)


async def serve(args: argparse.Namespace) -> None:
    template = UrlTemplate.parse(args.template)
    w = worker(Path(args.root), args.job)
    endpoints = Endpoints(
        lambda: [w], minion_id="bench", publisher=None, template=template, uid=None
    )
    app = ProxyApp(endpoints, Verdicts("bench", scheduler), template)
    server = ProxyServer(app, args.listen)
    await server.start()
    probes = asyncio.create_task(endpoints.run())
    print("ready", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        probes.cancel()
        await server.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--root", required=True, help="the workers' directory")
    p.add_argument("--job", default="j1")
    p.add_argument("--listen", default="127.0.0.1:8480")
    p.add_argument("--template", default="http://{job}.localhost:8480")
    args = p.parse_args()
    asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
