"""Heartbeats and liveness: a node that stops heartbeating is `lost` (NodeStateChanged,
workers: requeue) and returns to its previous state when heartbeats resume.

A node is `lost` after `node_lost_missed_heartbeats` of its own heartbeat periods (from its
registration) without one, and never sooner than `node_lost_min_s`, nor in the first
`node_lost_min_s` after the provisioner started (heartbeats sent while it was down were not
seen). A heartbeat counts only on its node's own subject (only that node may publish it).
"""

from __future__ import annotations

from gpufleet_bus import Delivery, on_its_own_subject
from gpufleet_contracts.nodes import NodeHeartbeat, NodeState
from gpufleet_store import Doc, Transaction, now_ms
from gpufleet_telemetry.instruments import METRICS

from .records import LIVE_STATES, Records


class Liveness:
    def __init__(self, records: Records) -> None:
        self.records = records
        self.db = records.db
        self.settings = records.settings
        self.started_ms = now_ms(records.clock())

    async def heartbeat(self, body: NodeHeartbeat, delivery: Delivery) -> None:
        """A node's heartbeat, on its own subject: a heartbeat naming another node in its
        body refreshes nothing."""
        if on_its_own_subject(delivery.subject, body.minion_id):
            await self.seen(body)

    async def seen(self, hb: NodeHeartbeat) -> None:
        now = now_ms(self.records.clock())
        node = await self.db.nodes.find_one({"minion_id": hb.minion_id})
        if node is None:
            return
        update: Doc = {"last_seen_ms": now, "telemetry": hb.model_dump(mode="json")}
        for g in hb.gpus:
            METRICS.set_gpu_utilization(hb.minion_id, g.index, g.utilization_pct)
        busy = bool(hb.running)
        if busy:
            update["busy"] = True
            update["idle_since_ms"] = None
        elif node.get("busy") or node.get("idle_since_ms") is None:
            update["busy"] = False
            update["idle_since_ms"] = now
        await self.db.nodes.update_one({"_id": node["_id"]}, {"$set": update})
        if node["state"] == NodeState.lost.value and not node.get("lost_for_good"):
            back = NodeState(node.get("state_before_lost") or NodeState.active.value)

            async def body(tx: Transaction) -> None:
                await self.records.set_state(
                    tx, node, back, "heartbeats resumed", expect=NodeState.lost.value
                )

            await self.records.transaction(body)

    def lost_after_ms(self, node: Doc) -> int:
        period = float(node.get("heartbeat_s") or 5.0)
        s = self.settings
        return int(1000 * max(s.node_lost_min_s, s.node_lost_missed_heartbeats * period))

    async def sweep(self) -> list[str]:
        """Mark `lost` every live node whose heartbeats stopped. Returns their minion ids."""
        now = now_ms(self.records.clock())
        if now - self.started_ms < 1000 * self.settings.node_lost_min_s:
            return []  # just started: heartbeats sent while we were down were not seen
        lost: list[str] = []
        candidates = await self.db.nodes.find(
            {"state": {"$in": list(LIVE_STATES)}, "kind": "compute"}
        ).to_list(None)
        for node in candidates:
            seen = node.get("last_seen_ms")
            if seen is None:
                continue
            silent = now - int(seen)
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
        return lost
