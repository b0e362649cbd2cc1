"""The provisioner's records: providers, regions and nodes, and the one way a node's state
changes (`set_state`, which emits NodeStateChanged in the same transaction).

Every other module (the account's requests in `providers` and `nodes`, `registration`,
`liveness`, the cloud side in `cloud` and `burst`) works through these operations; none
reaches into another's.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from gpufleet_bus import emit
from gpufleet_contracts.clock import Clock
from gpufleet_contracts.errors import NotFound, Refused
from gpufleet_contracts.nodes import NodeState, NodeStateChanged
from gpufleet_contracts.providers import (
    PaymentMode,
    ProviderEnabled,
    ProviderKind,
    ProviderView,
    RegionCreated,
    RegionView,
)
from gpufleet_store import Doc, Store, Transaction, now_ms
from pymongo import ASCENDING, IndexModel

from .settings import ProvisionerSettings
from .views import provider_view, region_view

if TYPE_CHECKING:
    from .identity import Identity

log = logging.getLogger("gpufleet.provisioner")
T = TypeVar("T")

INDEXES = {
    "providers": [IndexModel([("account", ASCENDING), ("provider", ASCENDING)], unique=True)],
    "regions": [IndexModel([("owner", ASCENDING), ("name", ASCENDING)], unique=True)],
    "nodes": [
        IndexModel([("minion_id", ASCENDING)], unique=True),
        IndexModel([("owner", ASCENDING), ("region", ASCENDING)]),
        IndexModel([("next_check_ms", ASCENDING)]),  # GPU checks due (checks.py)
    ],
}

# The rule a compute node fails while its central-storage region lacks its storage node.
NO_STORAGE_RULE = "R-NODE-3.storage-node"

# Node states that can serve work or wait for an operator; `lost` is entered from these.
LIVE_STATES = (NodeState.active.value, NodeState.maintenance.value)


def invalid(field: str, rule: str, message: str, valid: str | None = None) -> Refused:
    """A refusal of one field by a rule (nothing was changed)."""
    f = {"field": field, "rule": rule, "message": message}
    if valid:
        f["valid"] = valid
    return Refused("invalid", f"{field}: {message}", [f])


def node_id_for(minion_id: str) -> str:
    return f"node-{minion_id}"


def payment_mode(value: str) -> PaymentMode:
    """R-PROV-1: earnings are paid in credits; stripe payouts are coming soon."""
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


class Records:
    def __init__(
        self,
        store: Store,
        clock: Clock,
        settings: ProvisionerSettings,
        identity: Identity | None = None,
    ) -> None:
        self.store = store
        self.db = store.db
        self.clock = clock
        self.settings = settings
        self.identity = identity

    async def transaction(self, fn: Callable[[Transaction], Awaitable[T]]) -> T:
        return await self.store.transaction(fn)

    # --- providers (R-PROV-1) -----------------------------------------------------------

    async def provider(self, account: str, provider: str) -> Doc | None:
        doc: Doc | None = await self.db.providers.find_one({"_id": f"{account}/{provider}"})
        return doc

    async def enable(
        self, account: str, provider: ProviderKind, mode: PaymentMode, extra: Doc
    ) -> ProviderView:
        """Enable `provider` for `account`, at most once (R-PROV-1); its view."""
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

    # --- regions (R-REG-1/2) ------------------------------------------------------------

    async def insert_region(self, doc: Doc, extra_nodes: list[Doc] | None = None) -> RegionView:
        """A new region (names are unique per account) with its nodes; its view."""
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

    async def region(self, account: str, name: str) -> Doc:
        doc: Doc | None = await self.db.regions.find_one({"owner": account, "name": name})
        if doc is None:
            raise NotFound(f"region {name!r} not found")
        return doc

    async def storage_node_active(self, region: Doc, session: object = None) -> bool:
        """Whether `region` has an active storage node (R-NODE-3)."""
        found = await self.db.nodes.find_one(
            {
                "owner": region["owner"],
                "region": region["name"],
                "kind": "storage",
                "state": "active",
            },
            session=session,
        )
        return found is not None

    async def storage_missing(self, region: Doc, session: object = None) -> str | None:
        """The failed rule of a compute node in `region` while the region uses central
        storage and has no active storage node (R-NODE-3), or None."""
        if region.get("storage_mode") != "central" or await self.storage_node_active(
            region, session
        ):
            return None
        name = region["name"]
        return f"{NO_STORAGE_RULE}: region {name!r} uses central storage; no storage node is active"

    # --- nodes --------------------------------------------------------------------------

    async def find_node(self, account: str, ref: str) -> Doc:
        """The account's node named `ref` (its name, minion id or node id)."""
        node: Doc | None = await self.db.nodes.find_one(
            {"owner": account, "$or": [{"minion_id": ref}, {"name": ref}, {"_id": ref}]}
        )
        if node is None:
            raise NotFound(f"node {ref!r} not found")
        return node

    async def set_state(
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

    async def change_state(self, node: Doc, state: NodeState, reason: str) -> None:
        """`set_state` in a transaction of its own."""

        async def body(tx: Transaction) -> None:
            await self.set_state(tx, node, state, reason)

        await self.store.transaction(body)
