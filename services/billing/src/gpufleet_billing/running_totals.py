"""The `ledger_totals` collection: billing's series (totals.py) kept as running sums, one
document per series and labels, moved by `$inc` in the transaction that inserts the entries
they sum, so that reading them costs the same whatever the ledger's size.

Exact: an increment commits or aborts with its entries (a redelivered charge inserts nothing
and so adds nothing; a key another process took first aborts both). A placement's node,
owner and region are written once, with the placement, so an entry adds what the whole
ledger's sum would count for it. The collection is built once from the existing ledger, at
start (`ensure`, before anything is consumed), and again whenever TOTALS_VERSION changes.
"""

from __future__ import annotations

from collections.abc import Collection

from gpufleet_store import Doc, Store, Transaction
from pymongo import ReturnDocument, UpdateOne
from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.asynchronous.database import AsyncDatabase

from .totals import (
    LEDGER_FIELDS,
    PLACEMENT_FIELDS,
    SERIES_LABELS,
    LedgerTotals,
    TotalRow,
    ledger_totals,
)

TOTALS = "ledger_totals"
MARKER = "version"  # the marker document's _id: {_id, version}
TOTALS_VERSION = 1  # raise it when totals.ledger_totals's rules change: the next start rebuilds
BACKFILL_BATCH = 10_000  # entries summed at a time by a rebuild


async def add(db: AsyncDatabase[Doc], tx: Transaction, entries: list[Doc]) -> None:
    """Add what `entries` (being inserted in `tx`) count to their series, in `tx`."""
    rows = (await _summed(db, entries, tx.session)).rows()
    if rows:
        await db[TOTALS].bulk_write(
            [
                UpdateOne(
                    {"_id": r.key},
                    {"$inc": {"micro": r.micro}, "$setOnInsert": _labels(r)},
                    upsert=True,
                )
                for r in rows
            ],
            ordered=True,
            session=tx.session,
        )


async def read(db: AsyncDatabase[Doc]) -> LedgerTotals:
    docs = await db[TOTALS].find({"_id": {"$ne": MARKER}}).to_list(None)
    return LedgerTotals.from_rows(
        TotalRow(d["series"], tuple(str(d[k]) for k in SERIES_LABELS[d["series"]]), int(d["micro"]))
        for d in docs
        if d.get("series") in SERIES_LABELS
    )


async def ensure(store: Store) -> bool:
    """Build the sums from the whole ledger unless they are at TOTALS_VERSION; returns whether
    it built them. One transaction, which starts by writing the marker: two processes starting
    at once conflict there, and the second finds the work done. An insert committed before it
    is in the ledger it reads (its increments are replaced); one committed after adds to it."""
    db = store.db
    marker = await db[TOTALS].find_one({"_id": MARKER})
    if marker is not None and marker.get("version") == TOTALS_VERSION:
        return False

    async def body(tx: Transaction) -> bool:
        before = await db[TOTALS].find_one_and_update(
            {"_id": MARKER},
            {"$set": {"version": TOTALS_VERSION}},
            upsert=True,
            return_document=ReturnDocument.BEFORE,
            session=tx.session,
        )
        if before is not None and before.get("version") == TOTALS_VERSION:
            return False
        rows = (await whole_ledger(db, tx.session)).rows()
        await db[TOTALS].delete_many({"_id": {"$ne": MARKER}}, session=tx.session)
        if rows:
            await db[TOTALS].insert_many(
                [{"_id": r.key, "micro": r.micro, **_labels(r)} for r in rows], session=tx.session
            )
        return True

    return await store.transaction(body)


async def whole_ledger(
    db: AsyncDatabase[Doc], session: AsyncClientSession | None = None
) -> LedgerTotals:
    """The sums over every entry, a batch at a time (the rebuild; and what the running sums
    must always equal)."""
    out = LedgerTotals()
    batch: list[Doc] = []
    async for e in db.ledger.find({}, dict.fromkeys(LEDGER_FIELDS, 1), session=session):
        batch.append(e)
        if len(batch) >= BACKFILL_BATCH:
            out.add(await _summed(db, batch, session))
            batch = []
    out.add(await _summed(db, batch, session))
    return out


async def _summed(
    db: AsyncDatabase[Doc], entries: Collection[Doc], session: AsyncClientSession | None
) -> LedgerTotals:
    wanted = sorted({str(e["placement_id"]) for e in entries if e.get("placement_id")})
    placements: dict[str, Doc] = {}
    if wanted:
        found = db.placements.find(
            {"_id": {"$in": wanted}}, dict.fromkeys(PLACEMENT_FIELDS, 1), session=session
        )
        placements = {str(p["_id"]): p for p in await found.to_list(None)}
    return ledger_totals(entries, placements)


def _labels(r: TotalRow) -> Doc:
    return {"series": r.series, **dict(zip(SERIES_LABELS[r.series], r.labels, strict=True))}
