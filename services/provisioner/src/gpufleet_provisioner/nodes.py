"""An account's requests about its nodes (PRODUCT.md section 3): add (R-NODE-2/3), show,
list, maintenance on or off, remove and revoke.

A node is added by its `minion_id` into a physical region. A compute node waits, in
`provisioning`, for its agent's registration (`registration`); a storage node is active at
once, one per region (R-NODE-3), and a region with central storage needs an active one
before its compute nodes. Removing a node revokes its credential first (the server cuts it
off at once); its workers are requeued.
"""

from __future__ import annotations

import re

from gpufleet_contracts.errors import Refused
from gpufleet_contracts.identity import RevokeNode
from gpufleet_contracts.nodes import (
    AddNode,
    ListNodes,
    MaintenanceSet,
    NodeDetail,
    NodeList,
    NodeState,
    NodeView,
    RemoveNode,
    SetMaintenance,
    ShowNode,
)
from gpufleet_store import Doc, Transaction, now_ms

from .records import NO_STORAGE_RULE, Records, invalid, node_id_for
from .views import maintenance_set, node_detail, node_view

MINION_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class NodeRequests:
    def __init__(self, records: Records) -> None:
        self.records = records
        self.db = records.db

    async def list_nodes(self, body: ListNodes, account: str) -> NodeList:
        """The acting account's nodes; removed ones only when asked for."""
        query: Doc = {"owner": account}
        if not body.include_removed:
            query["state"] = {"$ne": NodeState.removed.value}
        nodes = await self.db.nodes.find(query).sort("name", 1).to_list(None)
        return NodeList(nodes=[node_view(n) for n in nodes])

    async def show_node(self, body: ShowNode, account: str) -> NodeDetail:
        """One node: state, history, hardware check results."""
        return node_detail(await self.records.find_node(account, body.node))

    async def add_node(self, body: AddNode, account: str) -> NodeView:
        """Add a compute or storage node by minion id."""
        region = await self.records.region(account, body.region)
        kind, minion_id = body.kind, body.minion_id
        if region["provider"] != "physical":
            raise invalid("region", "R-NODE-2", "nodes are added by hand only to physical regions")
        if kind not in {"compute", "storage"}:
            raise invalid("kind", "R-NODE-1", f"unknown node kind {kind!r}", "compute | storage")
        if not MINION_RE.fullmatch(minion_id):
            raise invalid(
                "minion_id", "R-NODE-2", "not a minion id", "1-64 letters, digits, '-', '_'"
            )
        if body.mining:
            raise invalid(
                "mining",
                "R-NODE-2",
                "mining needs wallet addresses configured on the account; none are",
            )
        if body.replace and kind != "storage":
            raise invalid("replace", "R-NODE-3", "only a storage node is replaced")
        now = self.records.clock()
        node_id = node_id_for(minion_id)

        async def tx_body(tx: Transaction) -> Doc:
            s = tx.session
            if await self.db.nodes.find_one({"_id": node_id}, session=s):
                raise Refused("conflict", f"a node with minion id {minion_id!r} already exists")
            others = await self.db.nodes.find(
                {"owner": account, "region": body.region, "state": {"$ne": "removed"}},
                session=s,
            ).to_list(None)
            storage = [n for n in others if n.get("kind") == "storage"]
            if kind == "storage" and storage and not body.replace:
                raise Refused(
                    "conflict",
                    f"region {body.region!r} already has storage node {storage[0]['name']!r} "
                    "(R-NODE-3: one per region); remove it or replace it "
                    "(gpufleet node replace-storage)",
                )
            central = kind == "compute" and region["storage_mode"] == "central"
            if central and not any(n["state"] == "active" for n in storage):
                raise Refused(
                    "conflict",
                    f"region {body.region!r} uses central storage: add its storage node "
                    "and let it become active before compute nodes (R-NODE-3)",
                )
            if body.replace:
                for old in storage:
                    await self.records.set_state(
                        tx, old, NodeState.removed, f"replaced by storage node {body.name!r}"
                    )
            # Storage nodes reach `active` by themselves (R-NODE-3); compute nodes wait for
            # their agent's registration and the hardware check.
            state = NodeState.active if kind == "storage" else NodeState.provisioning
            doc = {
                "_id": node_id,
                "minion_id": minion_id,
                "name": body.name,
                "region": body.region,
                "owner": account,
                "kind": kind,
                "provider": "physical",
                "state": state.value,
                "upnp": body.upnp,
                "mining": body.mining,
                "gpus": [],
                "simulated": False,
                "added_by_operator": True,
                "added_at_ms": now_ms(now),
                "history": [{"state": state.value, "at_ms": now_ms(now), "reason": "added"}],
            }
            await self.db.nodes.insert_one(doc, session=s)
            return doc

        return node_view(await self.records.transaction(tx_body))

    async def set_maintenance(self, body: SetMaintenance, account: str) -> MaintenanceSet:
        """Maintenance on (active -> maintenance) or off (maintenance -> active: only active
        nodes receive work). A node already in the state asked for is shown as it is, with
        `changed: false`, and no event."""
        node = await self.records.find_node(account, body.node)
        new = NodeState.maintenance if body.maintenance else NodeState.active
        state = node["state"]
        if state == new.value:
            return maintenance_set(node, changed=False)
        if state not in (NodeState.active.value, NodeState.maintenance.value):
            raise Refused(
                "conflict",
                f"node {node['name']!r} is {state}; only an active node or one in "
                "maintenance can go in or out of maintenance",
            )
        if new == NodeState.active:
            held = await self.held_by(node)
            if held:
                raise Refused(
                    "conflict",
                    f"node {node['name']!r} fails rules and stays out of service: "
                    + "; ".join(held),
                )
        reason = "maintenance on" if body.maintenance else "maintenance off"
        await self.records.change_state(node, new, f"{reason} (operator)")
        return maintenance_set(await self.records.find_node(account, body.node), changed=True)

    async def held_by(self, node: Doc) -> list[str]:
        """The rules that keep `node` out of service now: its hardware's (as registered;
        development may waive them) and, checked again now, its region's storage node."""
        waived = self.records.settings.waive_hardware_rules
        failed = [str(r) for r in node.get("failed_rules") or []]
        held = [] if waived else [r for r in failed if not r.startswith(NO_STORAGE_RULE)]
        if node.get("kind", "compute") == "compute" and node.get("provider") == "physical":
            region = await self.records.region(node["owner"], node["region"])
            missing = await self.records.storage_missing(region)
            if missing:
                held.append(missing)
        return held

    async def remove_node(self, body: RemoveNode, account: str) -> NodeView:
        """Remove a node; its credential is revoked first and its workers are requeued."""
        return await self._remove(account, body.node)

    async def revoke_node(self, body: RevokeNode, account: str) -> NodeView:
        """Cut a node off at once: its credential is revoked and it is removed (R-NODE-5)."""
        return await self._remove(account, body.node)

    async def _remove(self, account: str, ref: str) -> NodeView:
        """The node as it is now: shown alone (a NodeDetail) unless it was removed before."""
        node = await self.records.find_node(account, ref)
        if self.records.identity is not None:
            # Only this account's enrolment: another account's node of the same minion id
            # (added here before it registered) keeps its credential.
            await self.records.identity.revoke(node["minion_id"], account)
        if node["state"] == NodeState.removed.value:
            return node_view(node)
        if node.get("provider") == "gcp" and node.get("kind") == "compute":
            raise Refused(
                "conflict", "cloud nodes are removed by deleting their instance (idle policy)"
            )
        await self.records.change_state(node, NodeState.removed, "removed by operator")
        return node_detail(await self.records.find_node(account, ref))
