"""An endpoint's or notebook's reserved port (R-RES-3) served by the proxy's own app: the
node listens on the reservation's port on the addresses of the interfaces its operator
allows (those it publishes mDNS on, never a container bridge), over plain http, and each
request there is the proxy's (app.py) for the listener's job, whatever its Host says: its
key or token checked, held while the job starts, metered, forwarded to the job's worker
socket. Bytes are never carried to the worker's socket as they are: that would skip the
key's check."""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..host.port_forward import MAX_CONNECTIONS, ForwardFailed
from .app import JOB_SCOPE, ProxyApp, Receive, Scope, Send
from .server import ProxyServer

log = logging.getLogger("gpufleet.node_agent.proxy")


class OneJob:
    """The proxy's app for a listener of one job: the job set in the scope, which uvicorn
    makes afresh for each request (a caller's headers are in its `headers`, never a key)."""

    def __init__(self, app: ProxyApp, job_id: str) -> None:
        self.app = app
        self.job_id = job_id

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope[JOB_SCOPE] = self.job_id
        await self.app(scope, receive, send)


class ReservedPorts:
    """Each endpoint worker's reserved port, by worker key: at most one listener a worker.
    `addresses()`: the allowed interfaces' IPv4 addresses now; `live()`: whether the proxy
    runs (its probes find workers ready: without them every request would be held)."""

    def __init__(
        self,
        app: ProxyApp,
        addresses: Callable[[], list[str]],
        live: Callable[[], bool],
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.app = app
        self.addresses = addresses
        self.live = live
        self.max_connections = max_connections
        self._servers: dict[str, ProxyServer] = {}

    async def open(self, key: str, job_id: str, port: int) -> None:
        """Serve `port` for the worker `key` of `job_id` (again: as it is); ForwardFailed
        saying why not."""
        if key in self._servers:
            return
        if not self.live():
            raise ForwardFailed(
                "the node's endpoint proxy is not running (GPUFLEET_PROXY_LISTEN), "
                f"so port {port} cannot be served"
            )
        hosts = self.addresses()
        if not hosts:
            raise ForwardFailed("none of the interfaces the operator allows has an address")
        server = ProxyServer(
            OneJob(self.app, job_id),
            [f"{h}:{port}" for h in hosts],
            limit_concurrency=self.max_connections,  # a caller on the LAN cannot exhaust it
        )
        try:
            await server.start()
        except OSError as exc:
            where = ", ".join(hosts)
            raise ForwardFailed(f"port {port} cannot be served on {where}: {exc}") from None
        self._servers[key] = server
        log.info("worker %s: port %d served by the proxy on %s", key, port, ", ".join(hosts))

    async def close(self, key: str) -> None:
        """Stop serving the worker's port (twice: nothing)."""
        server = self._servers.pop(key, None)
        if server is not None:
            await server.stop()

    async def close_all(self) -> None:
        for key in list(self._servers):
            await self.close(key)
