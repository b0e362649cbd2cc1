"""The ledger: append-only, double-entry, idempotent (R-BILL-5).

Every entry has a key derived from the event that caused it (`usage:<placement_id>:<account>`),
unique in the collection, so a redelivered or replayed event can never charge twice. A balance
is the sum of an account's entries; nothing else is stored.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from decimal import Decimal
from typing import Any

from gpufleet_bus import emit
from gpufleet_contracts.billing import UsageCharged
from gpufleet_contracts.jobs import WorkerFinished, WorkerPlaced
from gpufleet_store import Store, Transaction
from pymongo import ASCENDING, IndexModel
from pymongo.errors import BulkWriteError, DuplicateKeyError

from .fees import from_micro, usage_postings

log = logging.getLogger("gpufleet.billing")

Doc = dict[str, Any]

INDEXES = {
    "placements": [IndexModel([("job_id", ASCENDING)])],
    "ledger": [
        IndexModel([("key", ASCENDING)], unique=True),
        IndexModel([("account", ASCENDING), ("at", ASCENDING)]),
        IndexModel([("job_id", ASCENDING)]),
    ],
}


class NotYetKnown(Exception):
    """An event arrived before the one it depends on; the bus retries it shortly."""


class Billing:
    def __init__(self, store: Store, clock: Callable[[], datetime]) -> None:
        self.store = store
        self.db = store.db
        self.clock = clock

    async def worker_placed(self, evt: WorkerPlaced) -> None:
        await self.db.placements.update_one(
            {"_id": evt.placement_id},
            {
                "$setOnInsert": {
                    "job_id": evt.job_id,
                    "worker": evt.worker,
                    "rate": str(evt.rate),
                    "gpu_count": evt.gpu_count,
                    "gpu_model": evt.gpu_model,
                    "charge": evt.charge,
                    "payer": evt.payer,
                    "node_owner": evt.node_owner,
                    "placed_at": evt.placed_at,
                }
            },
            upsert=True,
        )

    async def worker_finished(self, evt: WorkerFinished) -> int:
        """Charge a finished run; returns the number of entries written (0 on a replay)."""
        placement = await self.db.placements.find_one({"_id": evt.placement_id})
        if placement is None:
            raise NotYetKnown(f"placement {evt.placement_id} not seen yet")
        if evt.started_at is None:
            return 0  # never ran: nothing to charge
        duration_ms = max(0, int((evt.ended_at - evt.started_at).total_seconds() * 1000))
        rate = Decimal(placement["rate"])
        postings = usage_postings(
            charge=placement["charge"],
            payer=placement["payer"],
            node_owner=placement["node_owner"],
            gpu_model=placement["gpu_model"],
            rate=rate,
            gpu_count=placement["gpu_count"],
            duration_ms=duration_ms,
        )
        now = self.clock()
        entries = [
            {
                "_id": f"usage:{evt.placement_id}:{p.account}",
                "key": f"usage:{evt.placement_id}:{p.account}",
                "account": p.account,
                "kind": p.kind,
                "amount_micro": p.amount_micro,
                "job_id": evt.job_id,
                "worker": evt.worker,
                "placement_id": evt.placement_id,
                "rate": str(rate),
                "gpu_count": placement["gpu_count"],
                "duration_ms": duration_ms,
                "at": evt.ended_at,
                "recorded_at": now,
                "memo": f"{placement['gpu_count']} x {placement['gpu_model']} for "
                f"{duration_ms / 1000:.3f}s at {rate}/GPU-hour",
            }
            for p in postings
        ]

        async def body(tx: Transaction) -> None:
            await self.db.ledger.insert_many(entries, session=tx.session)
            for e in entries:
                emit(
                    tx,
                    UsageCharged(
                        entry_key=e["key"],
                        account=e["account"],
                        job_id=evt.job_id,
                        worker=evt.worker,
                        gpu_count=placement["gpu_count"],
                        rate=rate,
                        seconds=duration_ms // 1000,
                        amount_micro=e["amount_micro"],
                        at=evt.ended_at,
                    ),
                    msg_id=e["key"],
                )

        try:
            await self.store.transaction(body)
        except (DuplicateKeyError, BulkWriteError) as exc:
            if isinstance(exc, BulkWriteError) and any(
                e.get("code") != 11000 for e in exc.details.get("writeErrors", [])
            ):
                raise
            return 0  # already charged: a redelivery or a replay
        return len(entries)

    # --- queries --------------------------------------------------------------------

    async def balance(self, account: str) -> Doc:
        total, count = 0, 0
        async for e in self.db.ledger.find({"account": account}, {"amount_micro": 1}):
            total += int(e["amount_micro"])
            count += 1
        return {
            "account": account,
            "balance": str(from_micro(total)),
            "balance_micro": total,
            "entries": count,
        }

    async def entries(self, account: str, limit: int) -> list[Doc]:
        docs = await self.db.ledger.find({"account": account}).sort("at", -1).to_list(limit)
        return [self._entry(e) for e in docs]

    async def job_cost(self, job_id: str, account: str) -> Doc:
        docs = await self.db.ledger.find({"job_id": job_id, "account": account}).to_list(None)
        micro = -sum(int(e["amount_micro"]) for e in docs)
        return {
            "job_id": job_id,
            "cost": str(from_micro(micro)),
            "cost_micro": micro,
            "entries": [self._entry(e) for e in docs],
        }

    @staticmethod
    def _entry(e: Doc) -> Doc:
        return {
            "key": e["key"],
            "account": e["account"],
            "kind": e["kind"],
            "amount": str(from_micro(int(e["amount_micro"]))),
            "amount_micro": int(e["amount_micro"]),
            "job_id": e.get("job_id"),
            "worker": e.get("worker"),
            "at": e["at"].isoformat(),
            "memo": e.get("memo"),
        }
