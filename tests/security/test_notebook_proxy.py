"""A notebook's token opens that notebook and nothing else through the node's proxy: not
another job's notebook (in the query, an Authorization header or the proxy's cookie, over
HTTP or a websocket), not an endpoint; an endpoint's key opens no notebook; and what the
proxy sets in a browser holds one origin's token only (services/node-agent/README.md,
"Endpoints: the proxy and its trust model").

The proxy runs as the agent runs it (uvicorn on a TCP port) over two notebooks' workers and
an endpoint's, real servers on their unix sockets; raw HTTP/1.1 is written to it."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from unit.node_agent import proxykit
from unit.node_agent.proxykit import (
    Scheduler,
    Upstream,
    endpoint_worker,
    listening,
    new_token,
    notebook_worker,
    running_proxy,
    short_dir,
    socket_of,
)
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

COOKIE = "gpufleet-notebook"


@dataclass
class Scene:
    port: int
    nb1: Upstream
    nb2: Upstream
    endpoint: Upstream
    token1: str
    token2: str
    key3: str


@pytest.fixture
async def scene() -> AsyncIterator[Scene]:
    with short_dir() as root:
        token1, token2 = new_token(), new_token()
        w1 = notebook_worker(root, "j1", "p1", token1)
        w2 = notebook_worker(root, "j2", "p2", token2)
        w3 = endpoint_worker(root, "j3", "p3")
        ups = [await Upstream(socket_of(w), name=w.job_id).start() for w in (w1, w2, w3)]
        sched = Scheduler()
        key3 = sched.key_for("j3")
        try:
            async with (
                running_proxy([w1, w2, w3], sched, hold_s=1.0, uid=os.getuid()) as proxy,
                listening(proxy.app) as port,
            ):
                yield Scene(port, *ups, token1, token2, key3)
        finally:
            for up in ups:
                await up.stop()


async def raw(port: int, request: str) -> tuple[int, str]:
    """The status and the head of the answer to `request`, written as it is."""
    status, head, _ = await proxykit.raw(port, request)
    return status, head


def get(target: str, host: str, header: str = "") -> str:
    extra = f"{header}\r\n" if header else ""
    return f"GET {target} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n"


def untouched(s: Scene) -> None:
    assert s.nb2.seen == [] and s.nb2.sockets == [] and s.endpoint.seen == []


@pytest.mark.parametrize(
    "how",
    ["query", "authorization token", "authorization bearer", "cookie", "cookie and query"],
)
async def test_one_notebooks_token_does_not_open_another(scene: Scene, how: str) -> None:
    t = scene.token1
    target, header = {
        "query": (f"/lab?token={t}", ""),
        "authorization token": ("/api/contents", f"Authorization: token {t}"),
        "authorization bearer": ("/api/contents", f"Authorization: Bearer {t}"),
        "cookie": ("/lab", f"Cookie: {COOKIE}={t}"),
        "cookie and query": (f"/lab?token={t}", f"Cookie: {COOKIE}={t}"),
    }[how]
    status, head = await raw(scene.port, get(target, "j2.localhost:8480", header))
    assert status == 401 and "set-cookie" not in head.lower()
    untouched(scene)
    status, _ = await raw(scene.port, get(target, "j1.localhost:8480", header))
    assert status == 200 and len(scene.nb1.seen) == 1


async def test_a_token_opens_no_endpoint_and_a_key_no_notebook(scene: Scene) -> None:
    status, _ = await raw(
        scene.port, get("/", "j3.localhost:8480", f"Authorization: Bearer {scene.token1}")
    )
    assert status == 401
    for header in (f"Authorization: Bearer {scene.key3}", f"Cookie: {COOKIE}={scene.key3}"):
        status, _ = await raw(scene.port, get("/lab", "j2.localhost:8480", header))
        assert status == 401
    untouched(scene)


async def test_a_websocket_with_one_notebooks_token_does_not_reach_another(scene: Scene) -> None:
    t = scene.token1
    for headers, path in (
        ({}, f"/api/kernels/k/channels?token={t}"),
        ({"cookie": f"{COOKIE}={t}"}, "/api/kernels/k/channels"),
        ({"authorization": f"token {t}"}, "/api/kernels/k/channels"),
    ):
        with pytest.raises(InvalidStatus) as refused:
            await connect(
                f"ws://j2.localhost:8480{path}",
                host="127.0.0.1",
                port=scene.port,
                additional_headers=headers,
                open_timeout=10,
            )
        assert refused.value.response.status_code == 401
    untouched(scene)


async def test_the_cookie_set_holds_that_origins_token_only(scene: Scene) -> None:
    status, head = await raw(scene.port, get(f"/lab?token={scene.token1}", "j1.localhost:8480"))
    assert status == 200
    [cookie] = [line for line in head.split("\r\n") if line.lower().startswith("set-cookie:")]
    value = cookie.split(":", 1)[1].strip()
    assert value.startswith(f"{COOKIE}={scene.token1};")
    assert "domain=" not in value.lower()  # host-only: j1's origin, never j2's
    assert "HttpOnly" in value and "SameSite=Strict" in value
