"""Liveness apart from the load (issue 15): a provisioner that falls behind with heartbeats
marks no healthy node lost; a node that truly stops is still lost."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import nats
from gpufleet_contracts import subjects
from gpufleet_contracts.nodes import NodeHeartbeat
from gpufleet_devstack import EmbeddedMongo, NatsServer, wait_for_async

from ..conftest import store_for
from .test_nodes import provisioner, registration


class Nodes(threading.Thread):
    """Node agents heartbeating from their own thread and event loop, as separate
    processes would: a provisioner whose loop is held does not hold them."""

    def __init__(self, url: str, creds: dict[str, Path], period_s: float) -> None:
        super().__init__(daemon=True)
        self.url, self.creds, self.period_s = url, creds, period_s
        self.stopped = {m: threading.Event() for m in creds}  # a node that stops sending
        self.done = threading.Event()
        self.sent = dict.fromkeys(creds, 0)
        self.clock_off = dict.fromkeys(creds, timedelta(0))  # a node's clock, off ours

    def run(self) -> None:
        asyncio.run(self._send())

    async def _send(self) -> None:
        conns = {
            m: await nats.connect(self.url, **NatsServer.client(path))
            for m, path in self.creds.items()
        }
        while not self.done.is_set():
            for m, nc in conns.items():
                if not self.stopped[m].is_set():
                    self.sent[m] += 1
                    hb = NodeHeartbeat(
                        minion_id=m, at=datetime.now(UTC) + self.clock_off[m], seq=self.sent[m]
                    )
                    await nc.publish(subjects.heartbeat(m), hb.to_bytes())
            for nc in conns.values():
                await nc.flush()
            await asyncio.sleep(self.period_s)
        for nc in conns.values():
            await nc.close()


async def test_a_provisioner_behind_with_heartbeats_loses_no_healthy_node(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    async with provisioner(
        nats_server, mongo_server, db_prefix, auto_activate_nodes=True, heartbeat_late_s=0.3
    ) as bus:
        healthy, dead = f"ok-{uuid.uuid4().hex[:6]}", f"dead-{uuid.uuid4().hex[:6]}"
        creds = {}
        for m in (healthy, dead):
            await bus.send(registration(m, bus.account, "auto"))  # heartbeat_s 0.2: lost in 0.6 s
            creds[m] = nats_server.authority.directory / "test-nodes" / f"{m}.creds"

        async def active() -> bool:
            return all("active" in bus.states(m) for m in (healthy, dead))

        await wait_for_async(active, timeout=10)
        nodes = Nodes(nats_server.url, creds, 0.1)
        nodes.start()
        db = store_for("provisioner", mongo_server.url, db_prefix).db
        try:

            async def heard(m: str, after: datetime) -> bool:
                doc = await db.nodes.find_one({"minion_id": m})
                t = ((doc or {}).get("telemetry") or {}).get("at")
                return t is not None and datetime.fromisoformat(t) > after

            start = datetime.now(UTC)
            await wait_for_async(lambda: heard(healthy, start), timeout=10)
            # The provisioner's loop is held for 5 loss windows (a placement pass, a slow
            # store: whatever it is), while both nodes keep sending.
            time.sleep(3.0)  # noqa: ASYNC251 -- holding the loop is the point
            resumed = datetime.now(UTC)
            await wait_for_async(lambda: heard(healthy, resumed), timeout=10)
            await wait_for_async(lambda: heard(dead, resumed), timeout=10)
            assert "lost" not in bus.states(healthy) + bus.states(dead)
            # Now one node truly stops: it is lost; the other, still heard, is not.
            nodes.stopped[dead].set()

            async def lost() -> bool:
                return "lost" in bus.states(dead)

            await wait_for_async(lost, timeout=20)
            assert "lost" not in bus.states(healthy)
            event = next(
                e for e in bus.events if e.get("minion_id") == dead and e["state"] == "lost"
            )
            assert event["workers"] == "requeue" and "no heartbeat" in event["reason"]
        finally:
            nodes.done.set()
            await asyncio.to_thread(nodes.join, 10)
