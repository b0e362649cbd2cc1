"""A port reservation published with mDNS by the node that runs its worker (R-RES-3), on this
machine's LAN interface and real multicast: its hostname resolves through an mDNS browser
(python-zeroconf, as any host of the LAN asks) while the worker holds it and is gone after;
a name another host of the LAN answers gets one rename (`-2`), said in the worker's log,
and a second conflict fails the worker instead of renaming again; a bridge is refused. A
job in a container is served on the reservation's port of the node's LAN address, through
its socket and the relay (the container's side, run here as a host process) to its port;
an endpoint's port by the node's proxy there, its key checked."""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path

import httpx
import ifaddr
import pytest
from gpufleet_contracts.endpoints import Reservation
from gpufleet_contracts.reservations import ReservationView
from gpufleet_devstack import free_port, wait_for_async
from gpufleet_node_agent.host.mdns import BRIDGES, MdnsPublisher, parse_interfaces
from gpufleet_node_agent.host.port_forward import PortForwards
from gpufleet_node_agent.proxy.reserved import ReservedPorts
from gpufleet_node_agent.steps import serve
from gpufleet_node_agent.steps.base import WorkerFailed
from gpufleet_node_agent.steps.reservation import ReservationStep
from gpufleet_node_agent.worker.spec import WorkerSpec
from gpufleet_node_agent.worker.workdir import Worker
from unit.node_agent.proxykit import (
    Scheduler,
    Upstream,
    endpoint_worker,
    running_proxy,
    short_dir,
    socket_of,
)
from zeroconf import IPVersion, ServiceInfo
from zeroconf._services.info import AddressResolverIPv4
from zeroconf.asyncio import AsyncZeroconf

OTHER_HOST = "192.0.2.77"  # another host of the LAN, as its mDNS answers say


def lan() -> tuple[str, str] | None:
    """This machine's first interface that is not loopback or a bridge, and its IPv4."""
    for adapter in ifaddr.get_adapters():
        if BRIDGES.match(adapter.nice_name):
            continue
        for ip in adapter.ips:
            if isinstance(ip.ip, str):
                return adapter.nice_name, ip.ip
    return None


@pytest.fixture
async def browser() -> AsyncIterator[tuple[AsyncZeroconf, str, str]]:
    found = lan()
    if found is None:
        pytest.skip("no LAN interface with an IPv4 address")
    name, address = found
    zc = AsyncZeroconf(interfaces=[address], ip_version=IPVersion.V4Only)
    try:
        yield zc, name, address
    finally:
        await zc.async_close()


async def resolves(zc: AsyncZeroconf, hostname: str) -> list[str]:
    resolver = AddressResolverIPv4(f"{hostname}.local.")
    if not await resolver.async_request(zc.zeroconf, 2000):
        return []
    return resolver.parsed_addresses()


async def gone(zc: AsyncZeroconf, hostname: str) -> bool:
    """Whether the name stops resolving within 5 s (a goodbye reaches the browser's cache
    a moment after it is sent)."""
    for _ in range(10):
        if not await resolves(zc, hostname):
            return True
        await asyncio.sleep(0.5)
    return False


def worker(tmp_path: Path, name: str, runtime: str = "") -> Worker:
    spec = WorkerSpec(
        placement_id=f"p-{name}",
        job_id=f"j-{name}",
        worker=0,
        command=("true",),
        reservation=Reservation(region="lab", name=name),
        runtime=runtime,
    )
    d = tmp_path / name
    d.mkdir()
    return Worker(spec, d)


def asker(hostname: str, port: int) -> Callable[[str], Awaitable[ReservationView]]:
    async def ask(name: str) -> ReservationView:
        return ReservationView(
            name=name,
            region="lab",
            region_id="acct/lab",
            type="port",
            hostname=hostname,
            port=port,
            created_at=datetime.now(UTC),
        )

    return ask


async def test_the_hostname_resolves_while_the_worker_holds_it_and_is_gone_after(
    browser: tuple[AsyncZeroconf, str, str], tmp_path: Path
) -> None:
    zc, interface, address = browser
    publisher = MdnsPublisher([interface])
    step = ReservationStep(publisher, asker("gpufleet-demo", 8080))
    w = worker(tmp_path, "web")
    try:
        await step.setup(w)
        await step.setup(w)  # again (an agent restart): as it is
        assert await resolves(zc, "gpufleet-demo") == [address]
        await step.teardown(w)
        await step.teardown(w)  # twice: nothing
        assert await gone(zc, "gpufleet-demo")
    finally:
        await publisher.close()


async def test_a_name_taken_on_the_lan_is_renamed_once_and_never_again(
    browser: tuple[AsyncZeroconf, str, str], tmp_path: Path
) -> None:
    zc, interface, address = browser
    lan_host = AsyncZeroconf(interfaces=[address], ip_version=IPVersion.V4Only)
    taken = [
        ServiceInfo(
            "_http._tcp.local.",
            f"{h}._http._tcp.local.",
            port=80,
            addresses=[socket.inet_aton(OTHER_HOST)],
            server=f"{h}.local.",
        )
        for h in ("gpufleet-taken", "gpufleet-taken-2", "gpufleet-both", "gpufleet-both-2")
    ]
    publisher = MdnsPublisher([interface])
    try:
        for info in taken:
            if info.server != "gpufleet-taken-2.local.":
                await lan_host.async_register_service(info)
        renamed = worker(tmp_path, "renamed")
        await ReservationStep(publisher, asker("gpufleet-taken", 9000)).setup(renamed)
        assert await resolves(zc, "gpufleet-taken-2") != []
        assert "published as gpufleet-taken-2.local:9000" in renamed.file("log").read_text()

        failed = worker(tmp_path, "failed")
        with pytest.raises(WorkerFailed, match=r"gpufleet-both-2\.local are taken"):
            await ReservationStep(publisher, asker("gpufleet-both", 9001)).setup(failed)
    finally:
        await publisher.close()
        await lan_host.async_close()


def test_a_bridge_is_never_an_mdns_interface() -> None:
    for name in ("docker0", "podman1", "veth12ab", "cni-podman0", "br-3f2a", "lo"):
        with pytest.raises(ValueError, match="not the LAN"):
            parse_interfaces(f"eth0,{name}")
    assert parse_interfaces(" eth0 , enp3s0 ") == ["eth0", "enp3s0"]


async def fetched(address: str, port: int) -> bytes | None:
    """GET /hello.txt from address:port: the body, or None when nothing answers there."""
    try:
        r, w = await asyncio.open_connection(address, port)
    except OSError:
        return None
    try:
        w.write(b"GET /hello.txt HTTP/1.0\r\nHost: x\r\n\r\n")
        await w.drain()
        reply = await asyncio.wait_for(r.read(), 5)
    finally:
        w.close()
    return reply.partition(b"\r\n\r\n")[2] if reply.startswith(b"HTTP/1.0 200") else None


async def test_a_container_jobs_reserved_port_is_served_on_the_lan_through_its_socket(
    browser: tuple[AsyncZeroconf, str, str], tmp_path: Path
) -> None:
    zc, interface, address = browser
    port = free_port(address)
    publisher = MdnsPublisher([interface])
    forwards = PortForwards(lambda: [address])
    step = ReservationStep(publisher, asker("gpufleet-served", port), forwards)
    w = worker(tmp_path, "served")
    (w.dir / serve.SERVE_DIR).mkdir()
    site = tmp_path / "site"
    site.mkdir()
    (site / "hello.txt").write_text("served from the container\n")
    # the container's side: the job listens on the port on its own loopback, the relay
    # on its socket (here in the host's network namespace, on 127.0.0.1)
    job = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    relay = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gpufleet_endpoint",
        "relay",
        "--uds",
        str(serve.port_socket_path(w.dir)),
        "--to",
        f"127.0.0.1:{port}",
        "--",
        *job,
        cwd=site,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        await step.setup(w)
        await step.setup(w)  # again (an agent restart): as it is
        assert await resolves(zc, "gpufleet-served") == [address]

        async def answers() -> bool:
            return await fetched(address, port) == b"served from the container\n"

        await wait_for_async(answers, timeout=15)
        await step.teardown(w)
        await step.teardown(w)
        assert await fetched(address, port) is None  # no longer served by the node
        assert await fetched("127.0.0.1", port) is not None  # the job itself goes on

        # a bare process listens on the node's port itself: the node serves nothing
        bare = worker(tmp_path, "bare", runtime="process")
        bare_port = free_port(address)
        await ReservationStep(publisher, asker("gpufleet-bare", bare_port), forwards).setup(bare)
        assert await fetched(address, bare_port) is None
        with socket.socket() as own:
            own.bind((address, bare_port))  # free for the job
    finally:
        relay.terminate()
        await asyncio.wait_for(relay.wait(), 10)
        await forwards.close_all()
        await publisher.close()


async def test_an_endpoints_reserved_port_is_served_on_the_lan_by_the_proxy(
    browser: tuple[AsyncZeroconf, str, str],
) -> None:
    zc, interface, address = browser
    port = free_port(address)
    publisher = MdnsPublisher([interface])
    sched = Scheduler()
    key = sched.key_for("j1")
    with short_dir() as root:
        w = endpoint_worker(root, "j1", "p1")
        w = Worker(
            w.spec.model_copy(update={"reservation": Reservation(region="lab", name="api")}),
            w.dir,
        )
        up = await Upstream(socket_of(w), name="endpoint").start()
        try:
            async with running_proxy([w], sched) as proxy:
                ports = ReservedPorts(proxy.app, lambda: [address], lambda: True)
                step = ReservationStep(publisher, asker("gpufleet-api", port), reserved=ports)
                await step.setup(w)
                assert await resolves(zc, "gpufleet-api") == [address]
                url = f"http://{address}:{port}/hello"
                async with httpx.AsyncClient(timeout=10) as c:
                    assert (await c.get(url)).status_code == 401
                    r = await c.get(url, headers={"authorization": f"Bearer {key}"})
                    assert r.status_code == 200 and r.json()["name"] == "endpoint"
                    assert r.json()["headers"]["host"] == f"{address}:{port}"
                await step.teardown(w)
                assert await fetched(address, port) is None  # its listener closed
        finally:
            await up.stop()
            await publisher.close()
