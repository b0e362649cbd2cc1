"""What regional resources need to know of an account's region (R-RES-1, R-TEN-3), answered
to the datastore service and device-fleet: the region's id, its compute nodes that are not
removed (its devices are device-fleet's), and the owner's plan; and of a node that asks to
mount a datastore, its owner, region and sealing key. Reads only."""

from __future__ import annotations

from gpufleet_contracts.datastores import GetNodeFacts, GetRegionFacts, NodeFacts, RegionFacts
from gpufleet_contracts.errors import NotFound
from gpufleet_contracts.identity import Plan

from .records import Records


class RegionFactsRequests:
    def __init__(self, records: Records) -> None:
        self.records = records
        self.db = records.db

    async def region_facts(self, body: GetRegionFacts) -> RegionFacts:
        """`body.owner`'s region `body.region` (NotFound alike if there is none)."""
        region = await self.records.region(body.owner, body.region)
        compute = await self.db.nodes.count_documents(
            {
                "owner": body.owner,
                "region": body.region,
                "kind": "compute",  # a storage node runs no job (R-RES-1)
                "state": {"$ne": "removed"},
            }
        )
        account = await self.db.accounts.find_one({"_id": body.owner})
        plan = account["plan"] if account is not None else Plan.free.value
        return RegionFacts(
            region_id=str(region["_id"]),
            compute_nodes=compute,
            plan=plan,
            provider=str(region.get("provider") or "physical"),
            storage_mode=region.get("storage_mode"),
            storage_node_active=await self.records.storage_node_active(region),
        )

    async def node_facts(self, body: GetNodeFacts) -> NodeFacts:
        """The node `body.minion_id` (NotFound if there is none, or it was removed)."""
        node = await self.db.nodes.find_one(
            {"minion_id": body.minion_id, "state": {"$ne": "removed"}}
        )
        if node is None:
            raise NotFound(f"node {body.minion_id!r} not found")
        return NodeFacts(
            minion_id=node["minion_id"],
            owner=node["owner"],
            region=node["region"],
            sealing_key=node.get("sealing_key"),
        )
