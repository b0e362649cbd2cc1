"""An endpoint's or notebook's reserved port served by the proxy's app (proxy/reserved.py,
steps/reservation.py): a listener of one job, its callers' keys and tokens checked as on the
job's URL, whatever Host they send; one listener a worker, gone at its teardown; against
real HTTP servers on unix sockets standing for the workers (proxykit.py)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from gpufleet_contracts.endpoints import Reservation
from gpufleet_contracts.reservations import ReservationView
from gpufleet_node_agent.host.mdns import MdnsPublisher, Published
from gpufleet_node_agent.proxy.app import JOB_SCOPE
from gpufleet_node_agent.proxy.hosts import UrlTemplate
from gpufleet_node_agent.proxy.reserved import ReservedPorts
from gpufleet_node_agent.steps.base import WorkerFailed
from gpufleet_node_agent.steps.reservation import ReservationStep
from gpufleet_node_agent.worker.spec import WorkerSpec
from gpufleet_node_agent.worker.workdir import Worker

from .proxykit import (
    Scheduler,
    Upstream,
    endpoint_worker,
    free_port,
    new_token,
    notebook_worker,
    running_proxy,
    short_dir,
    socket_of,
)

LAN = "127.0.0.1"  # the allowed interfaces' address, here


class Announced(MdnsPublisher):
    """The names published, without multicast (tests/integration has the real one)."""

    def __init__(self) -> None:
        super().__init__([])
        self.names: dict[str, str] = {}

    async def publish(self, key: str, hostname: str, port: int) -> Published:
        self.names[key] = f"{hostname}.local:{port}"
        return Published(hostname, port)

    async def withdraw(self, key: str) -> None:
        self.names.pop(key, None)


def reserved(w: Worker) -> Worker:
    """`w` attached to the reservation `web`."""
    spec = w.spec.model_copy(update={"reservation": Reservation(region="lab", name="web")})
    return Worker(WorkerSpec.model_validate(spec.model_dump()), w.dir)


def step(publisher: MdnsPublisher, port: int, ports: ReservedPorts | None) -> ReservationStep:
    async def ask(name: str) -> ReservationView:
        return ReservationView(
            name=name,
            region="lab",
            region_id="acct/lab",
            type="port",
            hostname="demo",
            port=port,
            created_at=datetime.now(UTC),
        )

    return ReservationStep(publisher, ask, reserved=ports)


def lan_client(port: int, host: str) -> httpx.AsyncClient:
    """A caller on the LAN, which names the reservation's host (or any other)."""
    return httpx.AsyncClient(base_url=f"http://{LAN}:{port}", headers={"host": host}, timeout=30)


async def refused(port: int) -> bool:
    try:
        _, w = await asyncio.open_connection(LAN, port)
    except OSError:
        return True
    w.close()
    return False


async def test_an_endpoints_reserved_port_checks_its_key_and_serves_its_job_alone() -> None:
    with short_dir() as root:
        w1 = reserved(endpoint_worker(root, "j1", "p1"))
        w2 = endpoint_worker(root, "j2", "p2")
        up1 = await Upstream(socket_of(w1), name="w1").start()
        up2 = await Upstream(socket_of(w2), name="w2").start()
        sched = Scheduler()
        key1, key2 = sched.key_for("j1"), sched.key_for("j2")
        port = free_port()
        here = f"demo.local:{port}"
        names = Announced()
        try:
            async with running_proxy([w1, w2], sched) as proxy:
                ports = ReservedPorts(proxy.app, lambda: [LAN], lambda: True)
                s = step(names, port, ports)
                await s.setup(w1)
                await s.setup(w1)  # again (an agent restart): the same listener
                assert names.names == {w1.key: here}
                async with lan_client(port, here) as c:
                    r = await c.get("/x")
                    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
                    r = await c.get("/x", headers={"authorization": f"Bearer {key2}"})
                    assert (r.status_code, r.json()) == (404, {"detail": "not found"})
                    assert up1.seen == [] and up2.seen == []
                    r = await c.post(
                        "/predict?a=1",
                        content=b"x" * 100,
                        headers={"authorization": f"Bearer {key1}"},
                    )
                    assert r.status_code == 200 and r.json()["name"] == "w1"
                    h = r.json()["headers"]
                    assert "authorization" not in h and h["host"] == here
                    assert (h["x-forwarded-proto"], h["x-forwarded-host"]) == ("http", here)
                    # a Host naming another job (on the proxy's URL form) changes nothing
                    for key in (key2, key1):
                        auth = {"host": "j2.localhost:8480", "authorization": f"Bearer {key}"}
                        r = await c.get("/y", headers=auth)
                        assert r.status_code == (404 if key == key2 else 200)
                    assert r.json()["name"] == "w1" and up2.seen == []
                    # a header of the scope key's name is a header, not the scope's
                    r = await c.get(
                        "/z", headers={JOB_SCOPE: "j2", "authorization": f"Bearer {key2}"}
                    )
                    assert r.status_code == 404
                m = proxy.endpoints.of("j1")[0].meter
                assert (m.requests, m.bytes_in) == (2, 100)  # metered as on its URL

                # one listener a worker: another worker on the same port fails, saying why
                w3 = reserved(endpoint_worker(root, "j3", "p3"))
                with pytest.raises(WorkerFailed, match=rf"reservation web: port {port} cannot"):
                    await s.setup(w3)

                await s.teardown(w1)
                await s.teardown(w1)  # twice: nothing
                assert await refused(port) and names.names == {}
        finally:
            await up1.stop()
            await up2.stop()


async def test_a_notebooks_reserved_port_needs_its_token_and_holds_while_it_starts() -> None:
    with short_dir() as root:
        token = new_token()
        w = reserved(notebook_worker(root, "j1", "p1", token))
        sched = Scheduler()
        port = free_port()
        https = UrlTemplate.parse("https://{job}.nb.example.com")  # its URL's, not the port's
        async with running_proxy([w], sched, hold_s=20, template=https) as proxy:
            ports = ReservedPorts(proxy.app, lambda: [LAN], lambda: True)
            s = step(Announced(), port, ports)
            await s.setup(w)
            up: Upstream | None = None
            try:
                async with lan_client(port, f"demo.local:{port}") as c:
                    assert (await c.get("/lab")).status_code == 401
                    r = await c.get("/lab", headers={"authorization": f"token {new_token()}"})
                    assert r.status_code == 401
                    held = asyncio.create_task(c.get("/lab", params={"token": token}))
                    await asyncio.sleep(0.3)  # no socket yet: JupyterLab is starting
                    assert not held.done()
                    up = await Upstream(socket_of(w)).start()
                    r = await asyncio.wait_for(held, 10)
                    assert r.status_code == 200 and r.json()["target"] == f"/lab?token={token}"
                    cookie = r.headers["set-cookie"]
                    assert "HttpOnly" in cookie and "Secure" not in cookie  # plain http here
                    assert r.json()["headers"]["x-forwarded-proto"] == "http"
            finally:
                await s.teardown(w)
                if up is not None:
                    await up.stop()
            assert await refused(port)


async def test_an_endpoints_reserved_port_is_never_served_without_the_proxy(
    tmp_path: Path,
) -> None:
    w = reserved(endpoint_worker(tmp_path, "j1", "p1"))
    port = free_port()
    with pytest.raises(WorkerFailed, match="no endpoint proxy"):
        await step(Announced(), port, None).setup(w)
    async with running_proxy([w], Scheduler()) as proxy:
        down = ReservedPorts(proxy.app, lambda: [LAN], lambda: False)
        with pytest.raises(WorkerFailed, match="endpoint proxy is not running"):
            await step(Announced(), port, down).setup(w)
        nowhere = ReservedPorts(proxy.app, lambda: [], lambda: True)
        with pytest.raises(WorkerFailed, match="none of the interfaces"):
            await step(Announced(), port, nowhere).setup(w)
    assert await refused(port)
