"""Providers, regions and nodes. This release: physical nodes registering through their agent.

A node is known by its `minion_id`. Its first registration creates it (and its region, if this
account has none of that name yet, as a physical region with `local` storage, R-REG-1). An
operator normally toggles a new node out of `maintenance` (R-NODE-2); with
GPUFLEET_AUTO_ACTIVATE_NODES (the default for the development `just up`) it is `active` at once.
A later registration (an agent restart) refreshes its inventory and keeps its state.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from gpufleet_bus import emit
from gpufleet_contracts.nodes import NodeHeartbeat, NodeRegistered, NodeState, RegisterNode
from gpufleet_store import Store, Transaction, from_ms, now_ms
from pymongo import ASCENDING, IndexModel

log = logging.getLogger("gpufleet.provisioner")

Doc = dict[str, Any]

INDEXES = {
    "regions": [IndexModel([("owner", ASCENDING), ("name", ASCENDING)], unique=True)],
    "nodes": [
        IndexModel([("minion_id", ASCENDING)], unique=True),
        IndexModel([("owner", ASCENDING), ("region", ASCENDING)]),
    ],
}


def node_id_for(minion_id: str) -> str:
    return f"node-{minion_id}"


class Provisioner:
    def __init__(self, store: Store, clock: Callable[[], datetime], auto_activate: bool) -> None:
        self.store = store
        self.db = store.db
        self.clock = clock
        self.auto_activate = auto_activate

    async def register(self, cmd: RegisterNode, command_id: str | None) -> None:
        now = self.clock()
        node_id = node_id_for(cmd.minion_id)

        async def body(tx: Transaction) -> None:
            s = tx.session
            region = await self.db.regions.find_one(
                {"owner": cmd.owner, "name": cmd.region}, session=s
            )
            if region is None:
                region = {
                    "_id": f"{cmd.owner}/{cmd.region}",
                    "owner": cmd.owner,
                    "name": cmd.region,
                    "provider": "physical",
                    "storage_mode": "local",
                    "allow_public_jobs": False,
                    "created_at": now,
                }
                await self.db.regions.insert_one(region, session=s)
            existing = await self.db.nodes.find_one({"_id": node_id}, session=s)
            fresh = (NodeState.lost.value, NodeState.provisioning.value)
            if existing is None or existing["state"] in fresh:
                state = NodeState.active if self.auto_activate else NodeState.maintenance
            else:
                state = NodeState(existing["state"])
            doc = {
                "_id": node_id,
                "minion_id": cmd.minion_id,
                "name": cmd.name,
                "region": cmd.region,
                "owner": cmd.owner,
                "kind": "compute",
                "state": state.value,
                "gpus": [g.model_dump(mode="json") for g in cmd.gpus],
                "simulated": cmd.simulated,
                "inventory_source": cmd.inventory_source,
                "driver_version": cmd.driver_version,
                "hostname": cmd.hostname,
                "price_per_gpu_hour": None
                if cmd.price_per_gpu_hour is None
                else str(cmd.price_per_gpu_hour),
                "registered_at": existing["registered_at"] if existing else now,
                "agent_started_at": cmd.agent_started_at,
                "last_seen": now,
            }
            await self.db.nodes.replace_one({"_id": node_id}, doc, upsert=True, session=s)
            emit(
                tx,
                NodeRegistered(
                    node_id=node_id,
                    minion_id=cmd.minion_id,
                    name=cmd.name,
                    region=cmd.region,
                    owner=cmd.owner,
                    state=state,
                    gpus=cmd.gpus,
                    simulated=cmd.simulated,
                    price_per_gpu_hour=cmd.price_per_gpu_hour,
                    allow_public_jobs=bool(region.get("allow_public_jobs")),
                    at=now,
                ),
                # The same RegisterNode delivered twice yields one NodeRegistered.
                msg_id=f"registered:{command_id}" if command_id else None,
            )

        await self.store.transaction(body)
        log.info(
            "node %s registered in region %s (%d GPUs%s)",
            cmd.minion_id,
            cmd.region,
            len(cmd.gpus),
            ", simulated" if cmd.simulated else "",
        )

    async def heartbeat(self, hb: NodeHeartbeat) -> None:
        await self.db.nodes.update_one(
            {"minion_id": hb.minion_id},
            {
                "$set": {
                    "last_seen_ms": now_ms(self.clock()),
                    "telemetry": hb.model_dump(mode="json"),
                }
            },
        )

    async def list_nodes(self, account: str) -> list[Doc]:
        nodes = await self.db.nodes.find({"owner": account}).sort("name", 1).to_list(None)
        return [
            {
                "node_id": n["_id"],
                "minion_id": n["minion_id"],
                "name": n["name"],
                "region": n["region"],
                "owner": n["owner"],
                "state": n["state"],
                "kind": n.get("kind", "compute"),
                "gpus": n["gpus"],
                "simulated": n["simulated"],
                "inventory_source": n.get("inventory_source"),
                "last_seen": _iso(from_ms(n.get("last_seen_ms"))),
                "telemetry": n.get("telemetry"),
            }
            for n in nodes
        ]


def _iso(at: datetime | None) -> str | None:
    return at.isoformat() if at else None
