"""A reserved port served for a worker in a container (R-RES-3): the node listens on the
reservation's port on the addresses of the interfaces its operator allows (the ones it
publishes mDNS on, never a container bridge) and carries each connection byte for byte to
the worker's unix socket, where the relay in its container takes it on to the job's port
(steps/serve.py). The container keeps no network of its own."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("gpufleet.node_agent.port_forward")
CHUNK = 65536
MAX_CONNECTIONS = 256  # a worker's at once; past it a new one is closed at once


class ForwardFailed(Exception):
    """Why a reserved port cannot be served here (taken, no allowed address)."""


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(CHUNK):
            writer.write(chunk)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass


async def _carry(
    client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter, socket: Path
) -> None:
    try:
        worker_r, worker_w = await asyncio.open_unix_connection(str(socket))
    except OSError:  # the worker's container is not listening (yet, or any more)
        client_w.close()
        return
    try:
        await asyncio.gather(_pipe(client_r, worker_w), _pipe(worker_r, client_w))
    finally:
        for w in (worker_w, client_w):
            w.close()
            with contextlib.suppress(ConnectionError, OSError):
                await w.wait_closed()


class PortForwards:
    """Each worker's reserved port, by worker key; `addresses()`: the allowed interfaces'
    IPv4 addresses now."""

    def __init__(
        self, addresses: Callable[[], list[str]], max_connections: int = MAX_CONNECTIONS
    ) -> None:
        self.addresses = addresses
        self.max_connections = max_connections
        self._servers: dict[str, asyncio.Server] = {}

    async def open(self, key: str, port: int, socket: Path) -> None:
        """Serve `port` for the worker `key` (again: as it is)."""
        if key in self._servers:
            return
        hosts = self.addresses()
        if not hosts:
            raise ForwardFailed("none of the interfaces the operator allows has an address")

        carried = 0

        async def accepted(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            nonlocal carried
            if carried >= self.max_connections:  # a caller on the LAN cannot exhaust the node
                w.close()
                return
            carried += 1
            try:
                await _carry(r, w, socket)
            finally:
                carried -= 1

        try:
            server = await asyncio.start_server(accepted, host=hosts, port=port)
        except OSError as exc:
            where = ", ".join(hosts)
            raise ForwardFailed(f"port {port} cannot be served on {where}: {exc}") from None
        self._servers[key] = server
        log.info("worker %s: port %d served on %s", key, port, ", ".join(hosts))

    async def close(self, key: str) -> None:
        """Stop serving the worker's port (twice: nothing); connections open go on until
        either side ends them."""
        server = self._servers.pop(key, None)
        if server is not None:
            server.close()

    async def close_all(self) -> None:
        for key in list(self._servers):
            await self.close(key)
