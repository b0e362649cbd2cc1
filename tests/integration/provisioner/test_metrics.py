"""The provisioner's /metrics: a heartbeating node is up, a silent one lost and down."""

from __future__ import annotations

import asyncio
import urllib.request
import uuid

import pytest
from gpufleet_devstack import EmbeddedMongo, NatsServer, wait_for_async
from gpufleet_devstack.processes import free_port
from prometheus_client.parser import text_string_to_metric_families

from .test_liveness import Nodes
from .test_nodes import provisioner, registration


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


async def test_node_up_follows_the_heartbeats(
    nats_server: NatsServer,
    mongo_server: EmbeddedMongo,
    db_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    port = free_port()
    monkeypatch.setenv("GPUFLEET_METRICS_PORT", str(port))  # the service's Ports read it
    async with provisioner(nats_server, mongo_server, db_prefix, auto_activate_nodes=True) as bus:
        minion = f"m-{uuid.uuid4().hex[:6]}"
        await bus.send(registration(minion, bus.account, "auto"))  # heartbeat_s 0.2
        await wait_for_async(lambda: "active" in bus.states(minion), timeout=10)
        labels = (("node", minion), ("owner", bus.account), ("region", "auto"))
        up = ("gpufleet_node_up", labels)
        creds = nats_server.authority.directory / "test-nodes" / f"{minion}.creds"
        nodes = Nodes(nats_server.url, {minion: creds}, 0.1)
        nodes.start()
        try:

            async def value(want: float) -> bool:
                return (await asyncio.to_thread(scrape, port)).get(up) == want

            await wait_for_async(lambda: value(1), timeout=10)
            found = await asyncio.to_thread(scrape, port)
            assert found[("gpufleet_nodes", (("region", "auto"), ("state", "active")))] == 1
            assert found[("gpufleet_node_last_heartbeat_timestamp_seconds", labels)] > 0
            nodes.stopped[minion].set()
            await wait_for_async(lambda: "lost" in bus.states(minion), timeout=20)
            await wait_for_async(lambda: value(0), timeout=10)
            lost = await asyncio.to_thread(scrape, port)
            assert lost[("gpufleet_nodes", (("region", "auto"), ("state", "lost")))] == 1
        finally:
            nodes.done.set()
            await asyncio.to_thread(nodes.join, 10)
