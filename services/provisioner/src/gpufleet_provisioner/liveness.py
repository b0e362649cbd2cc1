"""Heartbeats and liveness: a node that stops heartbeating is `lost` (NodeStateChanged,
workers: requeue) and returns to its previous state when heartbeats resume.

A node is `lost` after `node_lost_missed_heartbeats` of its own heartbeat periods (from its
registration) without one, and never sooner than `node_lost_min_s`. A heartbeat counts only
on its node's own subject (only that node may publish it).

Liveness is kept apart from the load (issue 15): a heartbeat is handled in memory
(heartbeats.py: no database call, so it never waits behind the store), the store gets what
changed once per round (`flush`: last seen, telemetry, busy/idle, a lost node back), and
`sweep` judges silence on evidence the node could not send: never while the provisioner
itself is behind with heartbeats (they are handled late, or its rounds run late). Both run
on their own periodic task (app.py), not behind the burst passes. Before, each heartbeat
was a read and a write, "last seen" was when the provisioner got round to it, and on a
loaded machine 41 of 50 healthy nodes were declared lost and their jobs run twice.

Silence is measured on the monotonic clock (`mono_ms`), never on the wall clock (issue 16):
stepped an hour forward, the wall clock made every node silent for an hour at the next
sweep; stepped back, no node could be lost for an hour. The wall clock only stamps what
is stored (`last_seen_ms`, `idle_since_ms`), for people and the idle-node scale-down.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from gpufleet_bus import Delivery, on_its_own_subject
from gpufleet_contracts.nodes import NodeHeartbeat, NodeState
from gpufleet_store import Doc, Transaction, now_ms
from gpufleet_telemetry.instruments import METRICS
from pymongo import UpdateOne

from .heartbeats import HeartbeatBook
from .records import LIVE_STATES, Records

log = logging.getLogger("gpufleet.provisioner")


def monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


class Liveness:
    def __init__(self, records: Records, mono_ms: Callable[[], int] = monotonic_ms) -> None:
        self.records = records
        self.db = records.db
        self.settings = records.settings
        self.mono_ms = mono_ms  # every time the book keeps (heartbeats.py)
        self.started_ms = mono_ms()
        self.book = HeartbeatBook(
            self.started_ms,
            late_ms=int(self.settings.heartbeat_late_s * 1000),
            relearn_ms=int(self.settings.node_lost_min_s * 1000),
        )
        self._fresh: dict[str, NodeHeartbeat] = {}  # the latest heard of each, not yet stored
        self._missed: dict[str, int] = {}  # heartbeats sent in a silence and never heard
        self._round: float | None = None  # loop time of the last round (late rounds)

    async def heartbeat(self, body: NodeHeartbeat, delivery: Delivery) -> None:
        """A node's heartbeat, on its own subject: a heartbeat naming another node in its
        body refreshes nothing. Memory only: the next round stores it."""
        if on_its_own_subject(delivery.subject, body.minion_id):
            self.seen(body)

    def seen(self, hb: NodeHeartbeat) -> None:
        wall = now_ms(self.records.clock())
        missed = self.book.heard(hb.minion_id, now_ms(hb.at), hb.seq, self.mono_ms(), wall)
        if missed:
            self._missed[hb.minion_id] = self._missed.get(hb.minion_id, 0) + missed
        before = self._fresh.get(hb.minion_id)
        if before is None or before.at <= hb.at:
            self._fresh[hb.minion_id] = hb
        for g in hb.gpus:
            METRICS.set_gpu_utilization(hb.minion_id, g.index, g.utilization_pct)

    async def round(self) -> None:
        """One liveness round: what was heard stored, then silent nodes judged."""
        self._late_round()
        await self.flush()
        await self.sweep()

    def _late_round(self) -> None:
        """A round that ran late means heartbeats queued behind whatever held the loop."""
        t = asyncio.get_running_loop().time()
        if self._round is not None:
            late = t - self._round - self.settings.provisioner_tick_s
            if late * 1000 > self.book.late_ms:
                self.book.was_behind(self.mono_ms(), int(late * 1000))
        self._round = t

    async def flush(self) -> None:
        """Store what the heartbeats heard since the last round said: one read and one bulk
        write for every node heard; a lost node heard again returns to its previous state."""
        fresh, self._fresh = self._fresh, {}
        if not fresh:
            return
        heard_ms = {m: self.book.nodes[m].wall_ms for m in fresh if m in self.book.nodes}
        fields = ("minion_id", "state", "busy", "idle_since_ms", "lost_for_good")
        nodes = await self.db.nodes.find(
            {"minion_id": {"$in": list(fresh)}}, dict.fromkeys(fields, 1)
        ).to_list(None)
        writes = []
        back: list[Doc] = []
        for node in nodes:
            hb = fresh[node["minion_id"]]
            at = heard_ms.get(node["minion_id"]) or now_ms(self.records.clock())
            update: Doc = {"last_seen_ms": at, "telemetry": hb.model_dump(mode="json")}
            if hb.running:
                update["busy"] = True
                update["idle_since_ms"] = None
            elif node.get("busy") or node.get("idle_since_ms") is None:
                update["busy"] = False
                update["idle_since_ms"] = at
            writes.append(UpdateOne({"_id": node["_id"]}, {"$set": update}))
            if node["state"] == NodeState.lost.value and not node.get("lost_for_good"):
                back.append(node)
        if writes:
            await self.db.nodes.bulk_write(writes, ordered=False)
        for node in back:
            await self._back(node)

    async def _back(self, node: Doc) -> None:
        back = NodeState(node.get("state_before_lost") or NodeState.active.value)
        missed = self._missed.pop(node["minion_id"], None)
        reason = "heartbeats resumed" + (
            "" if missed is None else f" ({missed} sent in its silence were never heard)"
        )
        fresh = await self.db.nodes.find_one({"_id": node["_id"]})
        if fresh is None:
            return

        async def body(tx: Transaction) -> None:
            await self.records.set_state(tx, fresh, back, reason, expect=NodeState.lost.value)

        await self.records.transaction(body)

    def lost_after_ms(self, node: Doc) -> int:
        period = float(node.get("heartbeat_s") or 5.0)
        s = self.settings
        return int(1000 * max(s.node_lost_min_s, s.node_lost_missed_heartbeats * period))

    async def sweep(self) -> list[str]:
        """Mark `lost` every live node silent for longer than it may be, on evidence it
        could not send (heartbeats.py). Returns their minion ids."""
        now = self.mono_ms()
        if now - self.book.behind_ms < 1000 * self.settings.node_lost_min_s:
            return []  # we were behind (or just started): no node can be judged yet
        lost: list[str] = []
        candidates = await self.db.nodes.find(
            {"state": {"$in": list(LIVE_STATES)}, "kind": "compute"}
        ).to_list(None)
        for node in candidates:
            if node.get("last_seen_ms") is None or node["minion_id"] in self._fresh:
                continue  # never heard at all (not judged), or heard since the last flush
            silent = self.book.silent_ms(node["minion_id"], now)
            if silent < self.lost_after_ms(node):
                continue

            async def body(tx: Transaction, node: Doc = node, silent: int = silent) -> None:
                await self.records.set_state(
                    tx,
                    node,
                    NodeState.lost,
                    f"no heartbeat for {silent / 1000:.0f}s; its workers are requeued "
                    "(the node may be gone, the job is not)",
                    extra={"state_before_lost": node["state"]},
                    workers="requeue",
                )

            await self.records.transaction(body)
            lost.append(node["minion_id"])
        if lost:
            log.warning(
                "nodes lost: %s (heartbeat intake: behind %d times, worst %d ms late)",
                ", ".join(lost),
                self.book.behind_count,
                self.book.worst_late_ms,
            )
        return lost
