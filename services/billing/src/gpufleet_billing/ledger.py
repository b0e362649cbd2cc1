"""The ledger collection: append-only entries with unique keys (R-BILL-5).

Entries are only ever inserted, never updated or deleted. A stage of a group is written in one
transaction together with one event per entry in the outbox (msg id = entry key) and what the
entries add to billing's series (running_totals.py); a unique-key violation means another
writer settled the same stage first, and the caller recomputes.
"""

from __future__ import annotations

from datetime import datetime

from gpufleet_bus import emit
from gpufleet_store import Doc, Transaction
from gpufleet_telemetry.instruments import METRICS
from pymongo import ASCENDING, IndexModel
from pymongo.asynchronous.database import AsyncDatabase

from . import running_totals
from .events import event_for
from .fees import Posting
from .periods import to_ms
from .settle import Posted, entry_key

LEDGER_INDEXES = [
    IndexModel([("key", ASCENDING)], unique=True),
    IndexModel([("group", ASCENDING)]),
    IndexModel([("account", ASCENDING), ("at_ms", ASCENDING)]),
    IndexModel([("job_id", ASCENDING)]),
]


async def posted(db: AsyncDatabase[Doc], group: str, tx: Transaction | None = None) -> list[Posted]:
    session = tx.session if tx is not None else None
    docs = await db.ledger.find({"group": group}, session=session).to_list(None)
    return [
        Posted(d["account"], int(d["amount_micro"]), str(d["stage"]), str(d["kind"])) for d in docs
    ]


def stage_entries(
    *,
    group: str,
    stage: str,
    postings: list[Posting],
    at: datetime,
    recorded_at: datetime,
    meta: Doc,
) -> list[Doc]:
    """The entries of one stage of `group` (none for no postings), pure; `insert` writes
    them with their events."""
    if not postings:
        return []
    assert sum(p.amount_micro for p in postings) == 0, "a stage must balance"
    entries = []
    for p in postings:
        key = entry_key(group, stage, p.account)
        entries.append(
            {
                **meta,
                "_id": key,
                "key": key,
                "group": group,
                "stage": stage,
                "account": p.account,
                "kind": p.kind,
                "amount_micro": p.amount_micro,
                "at": at,
                "at_ms": to_ms(at),
                "recorded_at": recorded_at,
            }
        )
    return entries


async def insert(db: AsyncDatabase[Doc], tx: Transaction, entries: list[Doc]) -> None:
    """Insert entries (of any stages), add them to the running totals and queue one event
    each, in the transaction."""
    if not entries:
        return
    await db.ledger.insert_many(entries, session=tx.session)
    await running_totals.add(db, tx, entries)
    for e in entries:
        METRICS.ledger_entries.add(1, {"kind": str(e.get("kind"))})
    for e in entries:
        emit(tx, event_for(e), msg_id=e["key"])


async def posted_in(
    db: AsyncDatabase[Doc], groups: list[str], tx: Transaction
) -> dict[str, list[Posted]]:
    """What the ledger holds for each of `groups`, in one query."""
    out: dict[str, list[Posted]] = {g: [] for g in groups}
    docs = await db.ledger.find({"group": {"$in": groups}}, session=tx.session).to_list(None)
    for d in docs:
        out[str(d["group"])].append(
            Posted(d["account"], int(d["amount_micro"]), str(d["stage"]), str(d["kind"]))
        )
    return out
