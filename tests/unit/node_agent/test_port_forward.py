"""A reserved port carried to a worker's socket (host/port_forward.py): bytes both ways, and
no more connections at once than the node allows a worker (a LAN caller cannot exhaust it)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from gpufleet_node_agent.host.port_forward import PortForwards

from .proxykit import short_dir


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def test_connections_past_the_limit_are_closed_and_the_rest_carried() -> None:
    async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        while data := await r.read(100):
            w.write(data.upper())
            await w.drain()
        w.close()

    with short_dir() as d:
        sock = Path(d) / "port.sock"
        worker = await asyncio.start_unix_server(echo, path=str(sock))
        forwards = PortForwards(lambda: ["127.0.0.1"], max_connections=1)
        port = free_port()
        await forwards.open("w1", port, sock)
        try:
            r1, w1 = await asyncio.open_connection("127.0.0.1", port)
            w1.write(b"first")
            assert await asyncio.wait_for(r1.read(100), 5) == b"FIRST"
            r2, w2 = await asyncio.open_connection("127.0.0.1", port)
            assert await asyncio.wait_for(r2.read(100), 5) == b""  # closed: one at a time
            w2.close()
            w1.close()
            await w1.wait_closed()
            await asyncio.sleep(0.1)  # the first one's end is seen
            r3, w3 = await asyncio.open_connection("127.0.0.1", port)
            w3.write(b"third")
            assert await asyncio.wait_for(r3.read(100), 5) == b"THIRD"
            w3.close()
        finally:
            await forwards.close_all()
            worker.close()
