"""Providers, regions and nodes (PRODUCT.md sections 2 and 3).

Physical side: an account enables a provider once (R-PROV-1), creates regions (R-REG-1) and
adds nodes by `minion_id` (R-NODE-2/3). A node's agent registers with its inventory; a
compute node is checked against R-NODE-4 and stays out of service, with every failed rule
visible, until it passes. An added node lands in `maintenance` (an operator toggles it
`active`); GPUFLEET_AUTO_ACTIVATE_NODES (development) activates a passing node at once, and
lets an agent that nobody added register itself (creating its region when missing).

Liveness: a node that stops heartbeating is `lost` (NodeStateChanged, workers: requeue) and
returns to its previous state when heartbeats resume.

The GCP side (keys, regions with quotas, bursting, the lifecycle bridge) is `cloud.py`.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from gpufleet_bus import emit
from gpufleet_contracts.nodes import (
    HardwareInventory,
    NodeHeartbeat,
    NodeRegistered,
    NodeState,
    NodeStateChanged,
    RegisterNode,
)
from gpufleet_contracts.providers import PaymentMode, ProviderEnabled, ProviderKind, RegionCreated
from gpufleet_store import Store, Transaction, from_ms, now_ms
from gpufleet_telemetry.instruments import METRICS
from pymongo import ASCENDING, IndexModel

from .hardware import check_hardware
from .settings import ProvisionerSettings

if TYPE_CHECKING:
    from .identity import Identity

log = logging.getLogger("gpufleet.provisioner")

Doc = dict[str, Any]

INDEXES = {
    "providers": [IndexModel([("account", ASCENDING), ("provider", ASCENDING)], unique=True)],
    "regions": [IndexModel([("owner", ASCENDING), ("name", ASCENDING)], unique=True)],
    "nodes": [
        IndexModel([("minion_id", ASCENDING)], unique=True),
        IndexModel([("owner", ASCENDING), ("region", ASCENDING)]),
    ],
}

REGION_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
MINION_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# Node states that can serve work or wait for an operator; `lost` is entered from these.
LIVE_STATES = (NodeState.active.value, NodeState.maintenance.value)


class Refused(Exception):
    """A request the rules refuse; replied as an ErrorReply (nothing was changed)."""

    def __init__(self, code: str, message: str, fields: list[dict[str, str]] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.fields = fields or []


def invalid(field: str, rule: str, message: str, valid: str | None = None) -> Refused:
    f = {"field": field, "rule": rule, "message": message}
    if valid:
        f["valid"] = valid
    return Refused("invalid", f"{field}: {message}", [f])


def node_id_for(minion_id: str) -> str:
    return f"node-{minion_id}"


def _iso(at: datetime | None) -> str | None:
    return at.isoformat() if at else None


def entries(items: Any) -> list[Doc]:
    """A pushed list of documents. nx-27017 stores a document given to `$push` as its JSON
    text (MongoDB stores the document); reading through here means the same on both."""
    out: list[Doc] = []
    for item in items or []:
        if isinstance(item, str):
            try:
                item = json.loads(item)
            except json.JSONDecodeError:
                continue
        if isinstance(item, dict):
            out.append(item)
    return out


class Provisioner:
    def __init__(
        self,
        store: Store,
        clock: Callable[[], datetime],
        auto_activate: bool,
        settings: ProvisionerSettings | None = None,
        identity: Identity | None = None,
    ) -> None:
        self.store = store
        self.db = store.db
        self.clock = clock
        self.auto_activate = auto_activate
        self.settings = settings or ProvisionerSettings()
        self.identity = identity
        self.started_ms = now_ms(clock())

    # --- providers (R-PROV-1) -------------------------------------------------------------

    async def enable_physical(self, account: str, payment_mode: str) -> Doc:
        mode = self._payment_mode(payment_mode)
        return await self._enable(account, ProviderKind.physical, mode, {})

    def _payment_mode(self, value: str) -> PaymentMode:
        try:
            mode = PaymentMode(value)
        except ValueError:
            raise invalid(
                "payment_mode", "R-PROV-1", f"unknown payment mode {value!r}", "credits"
            ) from None
        if mode is PaymentMode.stripe:
            raise invalid(
                "payment_mode",
                "R-PROV-1",
                "stripe payouts are coming soon; use credits for now",
                "credits",
            )
        return mode

    async def _enable(
        self, account: str, provider: ProviderKind, mode: PaymentMode, extra: Doc
    ) -> Doc:
        now = self.clock()
        pid = f"{account}/{provider.value}"

        async def body(tx: Transaction) -> Doc:
            if await self.db.providers.find_one({"_id": pid}, session=tx.session):
                raise Refused(
                    "conflict",
                    f"the {provider.value} provider is already enabled for this account "
                    "(R-PROV-1: at most once)",
                )
            doc = {
                "_id": pid,
                "account": account,
                "provider": provider.value,
                "payment_mode": mode.value,
                "enabled_at_ms": now_ms(now),
                **extra,
            }
            await self.db.providers.insert_one(doc, session=tx.session)
            emit(
                tx,
                ProviderEnabled(
                    account=account,
                    provider=provider,
                    payment_mode=mode,
                    gcp_project_id=extra.get("gcp_project_id"),
                    at=now,
                ),
                msg_id=f"provider-enabled:{pid}",
            )
            return doc

        doc = await self.store.transaction(body)
        log.info("account %s enabled provider %s", account, provider.value)
        return provider_view(doc)

    async def provider(self, account: str, provider: str) -> Doc | None:
        doc: Doc | None = await self.db.providers.find_one({"_id": f"{account}/{provider}"})
        return doc

    async def list_providers(self, account: str) -> list[Doc]:
        docs = await self.db.providers.find({"account": account}).sort("provider", 1).to_list(None)
        return [provider_view(d) for d in docs]

    # --- regions (R-REG-1) ------------------------------------------------------------------

    async def create_physical_region(
        self, account: str, name: str, storage_mode: str, allow_public_jobs: bool
    ) -> Doc:
        if await self.provider(account, "physical") is None:
            raise Refused(
                "conflict",
                "enable the physical provider first (gpufleet provider enable physical)",
            )
        if not REGION_NAME_RE.fullmatch(name):
            raise invalid(
                "name",
                "R-REG-1",
                f"{name!r} is not a DNS host name",
                "lowercase letters, digits and '-', 1-63 characters",
            )
        if storage_mode not in {"local", "central"}:
            raise invalid("storage_mode", "R-REG-1", "unknown storage mode", "local | central")
        doc = {
            "_id": f"{account}/{name}",
            "owner": account,
            "name": name,
            "provider": "physical",
            "storage_mode": storage_mode,
            "allow_public_jobs": allow_public_jobs,
            "created_at_ms": now_ms(self.clock()),
        }
        return await self.insert_region(doc)

    async def insert_region(self, doc: Doc, extra_nodes: list[Doc] | None = None) -> Doc:
        now = self.clock()

        async def body(tx: Transaction) -> None:
            s = tx.session
            if await self.db.regions.find_one({"_id": doc["_id"]}, session=s):
                raise Refused(
                    "conflict", f"region {doc['name']!r} already exists (names are unique)"
                )
            await self.db.regions.insert_one(doc, session=s)
            for node in extra_nodes or []:
                await self.db.nodes.insert_one(node, session=s)
            emit(
                tx,
                RegionCreated(
                    account=doc["owner"],
                    provider=ProviderKind(doc["provider"]),
                    name=doc["name"],
                    storage_mode=doc.get("storage_mode"),
                    allow_public_jobs=bool(doc.get("allow_public_jobs")),
                    runnable_jobs=doc.get("runnable_jobs") or {},
                    at=now,
                ),
                msg_id=f"region-created:{doc['_id']}",
            )

        await self.store.transaction(body)
        log.info("region %s (%s) created for %s", doc["name"], doc["provider"], doc["owner"])
        return region_view(doc)

    async def list_regions(self, account: str) -> list[Doc]:
        docs = await self.db.regions.find({"owner": account}).sort("name", 1).to_list(None)
        return [region_view(d) for d in docs]

    async def region(self, account: str, name: str) -> Doc:
        doc: Doc | None = await self.db.regions.find_one({"owner": account, "name": name})
        if doc is None:
            raise Refused("not_found", f"region {name!r} not found")
        return doc

    # --- nodes (R-NODE-2/3) -----------------------------------------------------------------

    async def add_node(
        self,
        account: str,
        region_name: str,
        name: str,
        minion_id: str,
        kind: str,
        upnp: bool = True,
        mining: bool = False,
        replace: bool = False,
    ) -> Doc:
        region = await self.region(account, region_name)
        if region["provider"] != "physical":
            raise invalid("region", "R-NODE-2", "nodes are added by hand only to physical regions")
        if kind not in {"compute", "storage"}:
            raise invalid("kind", "R-NODE-1", f"unknown node kind {kind!r}", "compute | storage")
        if not MINION_RE.fullmatch(minion_id):
            raise invalid(
                "minion_id", "R-NODE-2", "not a minion id", "1-64 letters, digits, '-', '_'"
            )
        if mining:
            raise invalid(
                "mining",
                "R-NODE-2",
                "mining needs wallet addresses configured on the account; none are",
            )
        if replace and kind != "storage":
            raise invalid("replace", "R-NODE-3", "only a storage node is replaced")
        now = self.clock()
        node_id = node_id_for(minion_id)

        async def body(tx: Transaction) -> Doc:
            s = tx.session
            if await self.db.nodes.find_one({"_id": node_id}, session=s):
                raise Refused("conflict", f"a node with minion id {minion_id!r} already exists")
            others = await self.db.nodes.find(
                {"owner": account, "region": region_name, "state": {"$ne": "removed"}},
                session=s,
            ).to_list(None)
            storage = [n for n in others if n.get("kind") == "storage"]
            if kind == "storage" and storage and not replace:
                raise Refused(
                    "conflict",
                    f"region {region_name!r} already has storage node {storage[0]['name']!r} "
                    "(R-NODE-3: one per region); remove it or replace it "
                    "(gpufleet node replace-storage)",
                )
            central = kind == "compute" and region["storage_mode"] == "central"
            if central and not any(n["state"] == "active" for n in storage):
                raise Refused(
                    "conflict",
                    f"region {region_name!r} uses central storage: add its storage node "
                    "and let it become active before compute nodes (R-NODE-3)",
                )
            if replace:
                for old in storage:
                    await self._set_state(
                        tx, old, NodeState.removed, f"replaced by storage node {name!r}"
                    )
            # Storage nodes reach `active` by themselves (R-NODE-3); compute nodes wait for
            # their agent's registration and the hardware check.
            state = NodeState.active if kind == "storage" else NodeState.provisioning
            doc = {
                "_id": node_id,
                "minion_id": minion_id,
                "name": name,
                "region": region_name,
                "owner": account,
                "kind": kind,
                "provider": "physical",
                "state": state.value,
                "upnp": upnp,
                "mining": mining,
                "gpus": [],
                "simulated": False,
                "added_by_operator": True,
                "added_at_ms": now_ms(now),
                "history": [{"state": state.value, "at_ms": now_ms(now), "reason": "added"}],
            }
            await self.db.nodes.insert_one(doc, session=s)
            return doc

        doc = await self.store.transaction(body)
        return node_view(doc)

    async def _find_node(self, account: str, ref: str) -> Doc:
        node: Doc | None = await self.db.nodes.find_one(
            {"owner": account, "$or": [{"minion_id": ref}, {"name": ref}, {"_id": ref}]}
        )
        if node is None:
            raise Refused("not_found", f"node {ref!r} not found")
        return node

    async def show_node(self, account: str, ref: str) -> Doc:
        return node_view(await self._find_node(account, ref), full=True)

    async def toggle_maintenance(self, account: str, ref: str) -> Doc:
        node = await self._find_node(account, ref)
        state = node["state"]
        if state == NodeState.active.value:
            new = NodeState.maintenance
        elif state == NodeState.maintenance.value:
            if node.get("failed_rules"):
                raise Refused(
                    "conflict",
                    f"node {node['name']!r} fails the hardware requirements and stays out of "
                    "service: " + "; ".join(node["failed_rules"]),
                )
            new = NodeState.active
        else:
            raise Refused(
                "conflict",
                f"node {node['name']!r} is {state}; only an active node or one in "
                "maintenance can be toggled",
            )

        async def body(tx: Transaction) -> None:
            await self._set_state(tx, node, new, "toggled by operator")

        await self.store.transaction(body)
        return await self.show_node(account, ref)

    async def remove_node(self, account: str, ref: str, revoke: bool = True) -> Doc:
        """Remove a node; its credential is revoked first (the server cuts it off at once)."""
        node = await self._find_node(account, ref)
        if revoke and self.identity is not None:
            await self.identity.revoke(node["minion_id"], account)
        if node["state"] == NodeState.removed.value:
            return node_view(node)
        if node.get("provider") == "gcp" and node.get("kind") == "compute":
            raise Refused(
                "conflict", "cloud nodes are removed by deleting their instance (idle policy)"
            )

        async def body(tx: Transaction) -> None:
            await self._set_state(tx, node, NodeState.removed, "removed by operator")

        await self.store.transaction(body)
        return await self.show_node(account, ref)

    async def _set_state(
        self,
        tx: Transaction,
        node: Doc,
        state: NodeState,
        reason: str,
        *,
        workers: str | None = None,
        extra: Doc | None = None,
        expect: str | None = None,
    ) -> bool:
        """Change a node's state in `tx` and emit NodeStateChanged. False when `expect`
        (the state it must still be in) no longer holds: someone else changed it first."""
        at = self.clock()
        previous = node["state"]
        if workers is None and state in (NodeState.lost, NodeState.removed):
            workers = "requeue"
        update: Doc = {"$set": {"state": state.value, **(extra or {})}}
        update["$push"] = {"history": {"state": state.value, "at_ms": now_ms(at), "reason": reason}}
        res = await self.db.nodes.update_one(
            {"_id": node["_id"], "state": expect or previous}, update, session=tx.session
        )
        if res.matched_count == 0:
            return False
        emit(
            tx,
            NodeStateChanged(
                node_id=node["_id"],
                minion_id=node["minion_id"],
                state=state,
                previous=NodeState(previous),
                reason=reason,
                workers=workers,
                failed_rules=list((extra or {}).get("failed_rules") or []),
                at=at,
            ),
        )
        node["state"] = state.value
        log.info("node %s: %s -> %s (%s)", node["minion_id"], previous, state.value, reason)
        return True

    # --- registration (the agent) -------------------------------------------------------

    async def register(
        self, cmd: RegisterNode, command_id: str | None, account: str, region_name: str
    ) -> None:
        """`account` and `region_name` are the node's enrolment's: the payload's own
        `owner` and `region` are not trusted (R-TEN-2, R-NODE-2)."""
        cmd = cmd.model_copy(update={"owner": account, "region": region_name})
        now = self.clock()
        node_id = node_id_for(cmd.minion_id)

        async def body(tx: Transaction) -> None:
            s = tx.session
            region = await self.db.regions.find_one(
                {"owner": cmd.owner, "name": cmd.region}, session=s
            )
            existing = await self.db.nodes.find_one({"_id": node_id}, session=s)
            if region is None:
                if existing is not None or not self.auto_activate:
                    log.warning(
                        "node %s registers in unknown region %s of %s: ignored",
                        cmd.minion_id,
                        cmd.region,
                        cmd.owner,
                    )
                    return
                # Development: an agent nobody added creates its physical region.
                region = {
                    "_id": f"{cmd.owner}/{cmd.region}",
                    "owner": cmd.owner,
                    "name": cmd.region,
                    "provider": "physical",
                    "storage_mode": "local",
                    "allow_public_jobs": False,
                    "created_at_ms": now_ms(now),
                    "auto_created": True,
                }
                await self.db.regions.insert_one(region, session=s)
            if existing is not None and existing["owner"] != cmd.owner:
                log.warning("node %s registers for another account: ignored", cmd.minion_id)
                return
            cloud = region["provider"] == "gcp"
            failures: list[str] = []
            if not cloud:
                failures = [
                    str(f)
                    for f in check_hardware(
                        cmd.gpus,
                        cmd.hardware,
                        storage_mode=str(region.get("storage_mode") or "local"),
                        allow_public_jobs=bool(region.get("allow_public_jobs")),
                    )
                ]
            state = self._registered_state(existing, cloud, failures)
            doc: Doc = {
                "minion_id": cmd.minion_id,
                "name": existing["name"] if existing else cmd.name,
                "region": cmd.region,
                "owner": cmd.owner,
                "kind": "compute",
                "provider": region["provider"],
                "state": state.value,
                "gpus": [g.model_dump(mode="json") for g in cmd.gpus],
                "hardware": None if cmd.hardware is None else cmd.hardware.model_dump(mode="json"),
                "failed_rules": failures,
                "simulated": cmd.simulated,
                "inventory_source": cmd.inventory_source,
                "driver_version": cmd.driver_version,
                "hostname": cmd.hostname,
                "heartbeat_s": cmd.heartbeat_s,
                "price_per_gpu_hour": None
                if cmd.price_per_gpu_hour is None
                else str(cmd.price_per_gpu_hour),
                "registered_at_ms": now_ms(now),
                "agent_started_at": cmd.agent_started_at.isoformat(),
                "last_seen_ms": now_ms(now),
            }
            if cloud:
                doc["idle_since_ms"] = now_ms(now)
            update: Doc = {"$set": doc}
            if existing is None or existing["state"] != state.value:
                reason = (
                    "hardware requirements not met (R-NODE-4)"
                    if failures
                    else "registered by its agent"
                )
                update["$push"] = {
                    "history": {"state": state.value, "at_ms": now_ms(now), "reason": reason}
                }
            await self.db.nodes.update_one({"_id": node_id}, update, upsert=True, session=s)
            emit(
                tx,
                NodeRegistered(
                    node_id=node_id,
                    minion_id=cmd.minion_id,
                    name=doc["name"],
                    region=cmd.region,
                    owner=cmd.owner,
                    state=state,
                    gpus=cmd.gpus,
                    simulated=cmd.simulated,
                    price_per_gpu_hour=cmd.price_per_gpu_hour,
                    allow_public_jobs=bool(region.get("allow_public_jobs")),
                    gpu_shares=cmd.gpu_shares,
                    at=now,
                ),
                # The same RegisterNode delivered twice yields one NodeRegistered.
                msg_id=f"registered:{command_id}" if command_id else None,
            )
            if failures:
                log.warning(
                    "node %s fails the hardware requirements and stays out of service: %s",
                    cmd.minion_id,
                    "; ".join(failures),
                )

        await self.store.transaction(body)
        log.info(
            "node %s registered in region %s (%d GPUs%s)",
            cmd.minion_id,
            cmd.region,
            len(cmd.gpus),
            ", simulated" if cmd.simulated else "",
        )

    def _registered_state(
        self, existing: Doc | None, cloud: bool, failures: list[str]
    ) -> NodeState:
        current = None if existing is None else existing["state"]
        if current == NodeState.removed.value:
            return NodeState.removed
        if cloud:
            # A cloud node is active at once (R-NODE-2), unless it is on its way out.
            if existing is not None and (existing.get("cloud") or {}).get("state") in {
                "deleting",
                "deleted",
                "preempted",
                "terminated",
                "failed",
            }:
                return NodeState(current) if current else NodeState.maintenance
            return NodeState.active
        if failures:
            return NodeState.maintenance  # out of service, reasons in failed_rules
        if existing is None or current in (NodeState.lost.value, NodeState.provisioning.value):
            previous = (existing or {}).get("state_before_lost")
            if current == NodeState.lost.value and previous in LIVE_STATES:
                return NodeState(previous)
            # R-NODE-2: provisioned, it lands in maintenance for the operator (development:
            # GPUFLEET_AUTO_ACTIVATE_NODES activates it at once).
            return NodeState.active if self.auto_activate else NodeState.maintenance
        return NodeState(str(current))

    # --- heartbeats and liveness ---------------------------------------------------------

    async def heartbeat(self, hb: NodeHeartbeat) -> None:
        now = now_ms(self.clock())
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
                await self._set_state(
                    tx, node, back, "heartbeats resumed", expect=NodeState.lost.value
                )

            await self.store.transaction(body)

    def lost_after_ms(self, node: Doc) -> int:
        period = float(node.get("heartbeat_s") or 5.0)
        s = self.settings
        return int(1000 * max(s.node_lost_min_s, s.node_lost_missed_heartbeats * period))

    async def sweep_liveness(self) -> list[str]:
        """Mark `lost` every live node whose heartbeats stopped. Returns their minion ids."""
        now = now_ms(self.clock())
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
                await self._set_state(
                    tx,
                    node,
                    NodeState.lost,
                    f"no heartbeat for {silent / 1000:.0f}s; its workers are requeued "
                    "(the node may be gone, the job is not)",
                    extra={"state_before_lost": node["state"]},
                    workers="requeue",
                )

            await self.store.transaction(body)
            lost.append(node["minion_id"])
        return lost

    async def list_nodes(self, account: str) -> list[Doc]:
        nodes = await self.db.nodes.find({"owner": account}).sort("name", 1).to_list(None)
        return [node_view(n) for n in nodes]


def provider_view(doc: Doc) -> Doc:
    """What may be shown of a provider: never the key."""
    out = {
        "account": doc["account"],
        "provider": doc["provider"],
        "payment_mode": doc["payment_mode"],
        "enabled_at": _iso(from_ms(doc.get("enabled_at_ms"))),
    }
    for k in ("gcp_project_id", "client_email", "lifecycle", "policy"):
        if doc.get(k) is not None:
            out[k] = doc[k]
    return out


def region_view(doc: Doc) -> Doc:
    out = {
        "name": doc["name"],
        "owner": doc["owner"],
        "provider": doc["provider"],
        "storage_mode": doc.get("storage_mode"),
        "allow_public_jobs": bool(doc.get("allow_public_jobs")),
        "created_at": _iso(from_ms(doc.get("created_at_ms"))),
    }
    for k in ("quotas", "runnable_jobs", "zones", "storage_class", "storage_size_gb"):
        if doc.get(k) is not None:
            out[k] = doc[k]
    return out


def node_view(n: Doc, full: bool = False) -> Doc:
    out: Doc = {
        "node_id": n["_id"],
        "minion_id": n["minion_id"],
        "name": n["name"],
        "region": n["region"],
        "owner": n["owner"],
        "state": n["state"],
        "kind": n.get("kind", "compute"),
        "provider": n.get("provider", "physical"),
        "gpus": n.get("gpus") or [],
        "simulated": bool(n.get("simulated")),
        "inventory_source": n.get("inventory_source"),
        "failed_rules": n.get("failed_rules") or [],
        "last_seen": _iso(from_ms(n.get("last_seen_ms"))),
        "telemetry": n.get("telemetry"),
    }
    if n.get("cloud"):
        cloud = dict(n["cloud"])
        cloud["history"] = entries(cloud.get("history"))
        if not full:
            cloud.pop("history", None)
        out["cloud"] = cloud
    if full:
        out["hardware"] = n.get("hardware")
        out["history"] = entries(n.get("history"))
        out["busy"] = bool(n.get("busy"))
        out["idle_since"] = _iso(from_ms(n.get("idle_since_ms")))
    return out


__all__ = ["INDEXES", "HardwareInventory", "Provisioner", "Refused", "node_id_for"]
