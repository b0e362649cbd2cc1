"""Liveness under clocks that jump (issue 16): the provisioner's wall clock stepped an hour
forward or back, or a node agent's clock an hour off (or stepped back while it runs),
marks no healthy node lost, and a node that truly stops is still lost in a loss window."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from gpufleet_devstack import EmbeddedMongo, NatsServer, wait_for_async

from ..conftest import store_for
from .test_liveness import Nodes
from .test_nodes import Bus, provisioner, registration

HOUR = timedelta(hours=1)


class SteppedClock:
    """The provisioner's wall clock; `step` moves it as NTP stepping the host would."""

    def __init__(self) -> None:
        self.offset = timedelta(0)

    def __call__(self) -> datetime:
        return datetime.now(UTC) + self.offset


@dataclass
class Fleet:
    bus: Bus
    nodes: Nodes
    healthy: str
    dead: str
    heard: Callable[[str], object]


@asynccontextmanager
async def fleet(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str, clock: SteppedClock
) -> AsyncIterator[Fleet]:
    """Two nodes heartbeating every 0.1 s (lost after 0.6 s of silence), both active."""
    async with provisioner(
        nats_server, mongo_server, db_prefix, clock=clock, auto_activate_nodes=True
    ) as bus:
        healthy, dead = f"ok-{uuid.uuid4().hex[:6]}", f"dead-{uuid.uuid4().hex[:6]}"
        creds = {}
        for m in (healthy, dead):
            await bus.send(registration(m, bus.account, "auto"))  # heartbeat_s 0.2
            creds[m] = nats_server.authority.directory / "test-nodes" / f"{m}.creds"

        async def active() -> bool:
            return all("active" in bus.states(m) for m in (healthy, dead))

        await wait_for_async(active, timeout=10)
        nodes = Nodes(nats_server.url, creds, 0.1)
        db = store_for("provisioner", mongo_server.url, db_prefix).db
        seqs: dict[str, int] = {}

        async def heard(m: str) -> bool:
            """A heartbeat stored that was sent after the last call's."""
            doc = await db.nodes.find_one({"minion_id": m})
            seq = int(((doc or {}).get("telemetry") or {}).get("seq") or 0)
            new, seqs[m] = seq > seqs.get(m, 0), max(seq, seqs.get(m, 0))
            return new

        nodes.start()
        try:
            yield Fleet(bus, nodes, healthy, dead, heard)
        finally:
            nodes.done.set()
            await asyncio.to_thread(nodes.join, 10)


async def healthy_for_a_while_then_the_dead_one_is_lost(f: Fleet) -> None:
    """Ten loss windows with both sending: none lost. Then one stops: it is lost, the
    other is not."""
    for m in (f.healthy, f.dead):
        await wait_for_async(lambda m=m: f.heard(m), timeout=10)
    await asyncio.sleep(6 * 0.6)
    for m in (f.healthy, f.dead):
        await wait_for_async(lambda m=m: f.heard(m), timeout=10)
    assert "lost" not in f.bus.states(f.healthy) + f.bus.states(f.dead)
    f.nodes.stopped[f.dead].set()

    async def lost() -> bool:
        return "lost" in f.bus.states(f.dead)

    await wait_for_async(lost, timeout=15)
    assert "lost" not in f.bus.states(f.healthy)


@pytest.mark.parametrize("step", [HOUR, -HOUR], ids=["forward", "back"])
async def test_the_provisioners_clock_stepped_an_hour(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str, step: timedelta
) -> None:
    clock = SteppedClock()
    async with fleet(nats_server, mongo_server, db_prefix, clock) as f:
        await wait_for_async(lambda: f.heard(f.healthy), timeout=10)
        clock.offset += step
        await healthy_for_a_while_then_the_dead_one_is_lost(f)


@pytest.mark.parametrize(
    "off", [HOUR, -HOUR, "stepped-back"], ids=["ahead", "behind", "stepped-back"]
)
async def test_a_node_agents_clock_an_hour_off(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str, off: object
) -> None:
    async with fleet(nats_server, mongo_server, db_prefix, SteppedClock()) as f:
        if isinstance(off, timedelta):
            f.nodes.clock_off[f.healthy] = off
        await wait_for_async(lambda: f.heard(f.healthy), timeout=10)
        if off == "stepped-back":  # while it runs: all its heartbeats now look an hour late
            f.nodes.clock_off[f.healthy] = -HOUR
        await healthy_for_a_while_then_the_dead_one_is_lost(f)
