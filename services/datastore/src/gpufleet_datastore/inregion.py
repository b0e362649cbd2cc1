"""What an account keeps by name in one of its own regions (datastores, reservations): found,
listed and removed alike; another account's answers "not found" like one that does not exist."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from gpufleet_bus.publish import emit
from gpufleet_contracts.base import Event
from gpufleet_contracts.clock import Clock
from gpufleet_contracts.errors import NotFound
from gpufleet_store import Store, Transaction

Doc = dict[str, Any]


class InRegion:
    """One collection of `noun`s, each `{owner, region, region_id, name, ...}`."""

    def __init__(self, store: Store, collection: str, noun: str, clock: Clock) -> None:
        self.store = store
        self.coll = store.db[collection]
        self.noun = noun
        self.clock = clock

    async def own(self, owner: str, region: str, name: str) -> Doc:
        doc: Doc | None = await self.coll.find_one({"owner": owner, "region": region, "name": name})
        if doc is None:
            raise NotFound(f"{self.noun} {name!r} not found in region {region!r}")
        return doc

    async def docs(self, owner: str, region: str | None) -> list[Doc]:
        query: Doc = {"owner": owner}
        if region is not None:
            query["region"] = region
        return [d async for d in self.coll.find(query).sort([("region", 1), ("name", 1)])]

    async def remove(
        self, owner: str, region: str, name: str, removed: Callable[[Doc, datetime], Event]
    ) -> Doc:
        """Deletes it; `removed(doc, now)` is its event, emitted once (a repeated remove
        of a doc already gone emits nothing)."""
        doc = await self.own(owner, region, name)
        now = self.clock()

        async def tx_body(tx: Transaction) -> None:
            gone = await self.coll.delete_one({"_id": doc["_id"]}, session=tx.session)
            if gone.deleted_count:
                emit(
                    tx,
                    removed(doc, now),
                    msg_id=f"{self.noun}-removed:{doc['_id']}:{now.timestamp()}",
                )

        await self.store.transaction(tx_body)
        return doc
