"""The node's endpoint proxy reaches nothing but the socket of the job a request names, and
of that job only with its own key (services/node-agent/README.md, "Endpoints: the proxy and
its trust model").

The proxy runs as the agent runs it (ProxyServer: uvicorn on a TCP port) over two endpoint
jobs' workers, real HTTP servers on their unix sockets; beside them stand what an attacker
would like to reach instead: a TCP service on the node's loopback (NATS, say) and a unix
socket of the node's (podman's API, say). Raw HTTP/1.1 is written to the proxy, so that
absolute-form targets and odd Host headers go as the attacker writes them. The scheduler's
verdicts are its rule (a key opens its own endpoint, `elsewhere` for another)."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from gpufleet_node_agent.proxy.server import ProxyServer
from unit.node_agent import proxykit
from unit.node_agent.proxykit import (
    Scheduler,
    Upstream,
    endpoint_worker,
    running_proxy,
    short_dir,
    socket_of,
)


@dataclass
class Scene:
    port: int
    j1: Upstream
    j2: Upstream
    node_socket: Upstream
    node_tcp: list[int]  # connections the node's TCP service accepted
    node_tcp_port: int
    key1: str
    key2: str
    root: Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
async def scene() -> AsyncIterator[Scene]:
    with short_dir() as root:
        w1, w2 = endpoint_worker(root, "j1", "p1"), endpoint_worker(root, "j2", "p2")
        j1 = await Upstream(socket_of(w1), name="j1").start()
        j2 = await Upstream(socket_of(w2), name="j2").start()
        node_socket = await Upstream(root / "podman.sock", name="node").start()
        accepted: list[int] = []

        async def node_service(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            accepted.append(1)
            w.close()

        tcp = await asyncio.start_server(node_service, "127.0.0.1", 0)
        sched = Scheduler()
        key1, key2 = sched.key_for("j1"), sched.key_for("j2")
        port = free_port()
        async with running_proxy([w1, w2], sched, hold_s=1.0, uid=os.getuid()) as proxy:
            server = ProxyServer(proxy.app, f"127.0.0.1:{port}")
            await server.start()
            try:
                yield Scene(
                    port,
                    j1,
                    j2,
                    node_socket,
                    accepted,
                    tcp.sockets[0].getsockname()[1],
                    key1,
                    key2,
                    root,
                )
            finally:
                await server.stop()
                tcp.close()
                for up in (j1, j2, node_socket):
                    await up.stop()


async def raw(port: int, request: str) -> tuple[int, str]:
    """The status and the body of the answer to `request`, written as it is."""
    status, _, body = await proxykit.raw(port, request)
    return status, body


def get(target: str, host: str, key: str | None) -> str:
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    return f"GET {target} HTTP/1.1\r\nHost: {host}\r\n{auth}Connection: close\r\n\r\n"


def untouched(s: Scene, *, j1: int = 0) -> None:
    assert len(s.j1.seen) == j1
    assert s.j2.seen == [] and s.node_socket.seen == [] and s.node_tcp == []


async def test_an_absolute_form_target_reaches_only_the_named_jobs_worker(scene: Scene) -> None:
    s = scene
    elsewhere = f"http://127.0.0.1:{s.node_tcp_port}/"
    status, body = await raw(s.port, get(elsewhere, "j1.localhost:8480", s.key1))
    assert status == 200 and '"name": "j1"' in body  # j1's worker, asked for its "/"
    assert [seen.target for seen in s.j1.seen] == ["/"]
    status, _ = await raw(s.port, get(elsewhere, f"127.0.0.1:{s.node_tcp_port}", s.key1))
    assert status == 404
    for target in ("//127.0.0.1:4222/", "/../../podman.sock", "/%2e%2e/%2e%2e/p2/serve"):
        status, body = await raw(s.port, get(target, "j1.localhost:8480", s.key1))
        assert status == 200 and '"name": "j1"' in body
    assert all(seen.target.startswith("/") for seen in s.j1.seen)
    untouched(s, j1=len(s.j1.seen))


@pytest.mark.parametrize(
    "host",
    [
        "j2.localhost:8480",  # the other job, with this job's key: not found
        "j2.localhost:8480@j1.localhost:8480",
        "j1.localhost:8480@j2",
        "..localhost:8480",
        "j1..localhost:8480",
        "j1.localhost:8480/../j2",
        "%6a2.localhost:8480",
        "j2%00.localhost:8480",
        "127.0.0.1:4222",
        "localhost:8480",
        "podman.sock",
        "p2.localhost:8480",  # a placement's directory is not a job
    ],
)
async def test_a_host_trick_with_one_jobs_key_reaches_nothing(scene: Scene, host: str) -> None:
    status, body = await raw(scene.port, get("/", host, scene.key1))
    assert (status, body) == (404, '{"detail":"not found"}')
    untouched(scene)


async def test_another_jobs_key_is_not_found_and_the_right_one_reaches_it(scene: Scene) -> None:
    status, body = await raw(scene.port, get("/", "J2.LOCALHOST:8480", scene.key1))
    assert (status, body) == (404, '{"detail":"not found"}')
    untouched(scene)
    status, body = await raw(scene.port, get("/", "J2.LOCALHOST:8480", scene.key2))
    assert status == 200 and '"name": "j2"' in body


async def test_a_link_planted_in_place_of_the_socket_is_not_followed(scene: Scene) -> None:
    sock = scene.root / "p1" / "serve" / "http.sock"
    await scene.j1.stop()
    sock.unlink(missing_ok=True)
    os.symlink(scene.root / "podman.sock", sock)  # what a job could make of its directory
    status, _ = await raw(scene.port, get("/containers/json", "j1.localhost:8480", scene.key1))
    assert status == 503
    assert scene.node_socket.seen == []
