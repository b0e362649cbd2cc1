"""The billing service layer: applies the pure fee rules to the ledger, idempotently.

Handlers record facts (placements, starts, ends, devices, payment modes) and settle the charge
groups those facts change; the clock (`tick`) settles what time makes due: running hours,
finished days' device fees, daily payouts. Every write goes through `settle.delta`, so a
replayed event or a repeated tick posts nothing, and a fact learned late posts the exact
correction. One lock serialises this process's writes; unique entry keys stop two processes.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any

from gpufleet_contracts.devices import DeviceAdded, DeviceRemoved
from gpufleet_contracts.jobs import WorkerFinished, WorkerPlaced, WorkerStarted
from gpufleet_contracts.providers import PaymentMode, ProviderEnabled
from gpufleet_store import Store, Transaction
from pymongo import ASCENDING, IndexModel
from pymongo.errors import BulkWriteError, DuplicateKeyError

from . import ledger
from .device_fees import DeviceSpan, device_fee_postings, devices_charged
from .fees import (
    MS_PER_HOUR,
    PLATFORM,
    Posting,
    earnings_account,
    federated_postings,
    is_federated,
    usage_postings,
)
from .periods import (
    Clock,
    day_bounds_ms,
    day_of,
    days,
    from_ms,
    full_hours,
    run_end_ms,
    run_start_ms,
    to_ms,
)
from .settle import delta, next_revision

log = logging.getLogger("gpufleet.billing")

Doc = dict[str, Any]

INDEXES = {
    "placements": [IndexModel([("job_id", ASCENDING)])],
    "ledger": ledger.LEDGER_INDEXES,
    "devices": [IndexModel([("account", ASCENDING)])],
    "payout_accounts": [],
    "cursors": [],
}
MAX_HOURS_PER_TICK = 24  # hours the clock bills for one placement in one tick; later ticks go on


class NotYetKnown(Exception):
    """An event arrived before the one it depends on; the bus retries it shortly."""


class Billing:
    def __init__(self, store: Store, clock: Clock) -> None:
        self.store = store
        self.db = store.db
        self.clock = clock
        self.lock = asyncio.Lock()
        self.stopping = False  # set on shutdown: the clock stops between settlements

    async def _write(self, body: Callable[[Transaction], Awaitable[int]]) -> int:
        """Run a settling transaction (the caller holds the lock); recompute if another
        process took the same keys first."""
        for _ in range(5):
            try:
                return await self.store.transaction(body)
            except (DuplicateKeyError, BulkWriteError) as exc:
                if isinstance(exc, BulkWriteError) and any(
                    e.get("code") != 11000 for e in exc.details.get("writeErrors", [])
                ):
                    raise
        raise RuntimeError("ledger keys kept colliding")

    # --- workers: usage, market price and earnings, federated fee ----------------------

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
                    "creator": evt.creator,
                    "job_type": str(evt.job_type),
                    "node_id": evt.node_id,
                    "minion_id": evt.minion_id,
                    "region": evt.region,
                    "placed_at": evt.placed_at,
                    "gpu_fraction": str(evt.gpu_fraction) if evt.gpu_fraction else None,
                    "hours_billed": 0,
                }
            },
            upsert=True,
        )

    async def worker_started(self, evt: WorkerStarted, received_at: datetime | None = None) -> None:
        """Record the start: from now on the clock bills each full running hour.

        The node's `started_at` is clamped to [placed_at, received_at] (`received_at`: the
        stream's timestamp of the event, the same on a replay; None only in direct calls)."""
        p = await self.db.placements.find_one({"_id": evt.placement_id})
        if p is None:
            raise NotYetKnown(f"placement {evt.placement_id} not seen yet")
        if not _from_its_node(p, evt.minion_id):
            return
        started_ms = run_start_ms(to_ms(evt.started_at), _placed_ms(p), _ms(received_at))
        await self.db.placements.update_one(
            {"_id": evt.placement_id, "started_ms": {"$exists": False}},
            {"$set": {"started_ms": started_ms}},
        )

    async def worker_finished(
        self, evt: WorkerFinished, received_at: datetime | None = None
    ) -> int:
        """Settle a run to its exact total; returns the entries written (0 on a replay).

        The node's times are clamped: the start to [placed_at, received_at], the end to
        [start, received_at] (`received_at` as for `worker_started`)."""
        placed = await self.db.placements.find_one({"_id": evt.placement_id})
        if placed is None:
            raise NotYetKnown(f"placement {evt.placement_id} not seen yet")
        if not _from_its_node(placed, evt.minion_id):
            return 0

        async def body(tx: Transaction) -> int:
            p = await self.db.placements.find_one({"_id": evt.placement_id}, session=tx.session)
            if p is None or "ended_ms" in p:
                return 0  # already settled: a redelivery or a replay
            received_ms = _ms(received_at)
            started_ms = p.get("started_ms")
            if evt.started_at is not None:
                started_ms = run_start_ms(to_ms(evt.started_at), _placed_ms(p), received_ms)
            ended_ms = run_end_ms(to_ms(evt.ended_at), started_ms, received_ms)
            fields: Doc = {"ended_ms": ended_ms}
            if started_ms is not None:
                fields["started_ms"] = started_ms
            await self.db.placements.update_one(
                {"_id": evt.placement_id}, {"$set": fields}, session=tx.session
            )
            if started_ms is None:
                return 0  # never ran: nothing to charge
            duration = max(0, ended_ms - started_ms)
            covered = duration - int(p.get("hours_billed", 0)) * MS_PER_HOUR
            return await self._settle_worker(tx, p, "end", duration, from_ms(ended_ms), covered)

        async with self.lock:
            return await self._write(body)

    async def _settle_worker(
        self, tx: Transaction, p: Doc, stage: str, duration_ms: int, at: datetime, covered: int
    ) -> int:
        """Bring every charge group of placement `p` to its total over `duration_ms`."""
        written = 0
        meta: Doc = {
            "job_id": p["job_id"],
            "worker": p["worker"],
            "placement_id": p["_id"],
            "node_id": p.get("node_id", ""),
            "region": p.get("region", ""),
            "gpu_count": p["gpu_count"],
            "gpu_model": p["gpu_model"],
            "rate": p["rate"],
            "job_type": p.get("job_type", "training"),
            "covered_ms": covered,
            "duration_ms": duration_ms,
        }
        for group, target in _worker_targets(p, duration_ms):
            change = delta(target, await ledger.posted(self.db, group, tx))
            memo = _worker_memo(p, group, stage, duration_ms)
            written += len(
                await ledger.write_stage(
                    self.db,
                    tx,
                    group=group,
                    stage=stage,
                    postings=change,
                    at=at,
                    recorded_at=self.clock(),
                    meta={**meta, "memo": memo},
                )
            )
        return written

    async def bill_running_hours(self, now_ms: int) -> int:
        """At the end of each running hour, bill that hour (R-BILL-4: earnings credited hourly).
        At most MAX_HOURS_PER_TICK hours per placement per tick: a long backlog is caught up
        over the following ticks instead of stalling this one."""
        written = 0
        running = self.db.placements.find(
            {"started_ms": {"$exists": True}, "ended_ms": {"$exists": False}}
        )
        for p in await running.to_list(None):
            billed = int(p.get("hours_billed", 0))
            due = min(full_hours(int(p["started_ms"]), now_ms), billed + MAX_HOURS_PER_TICK)
            for k in range(billed + 1, due + 1):
                if self.stopping:
                    return written  # the next start catches up from here
                written += await self._bill_hour(p["_id"], k)
        return written

    async def _bill_hour(self, placement_id: str, k: int) -> int:
        async def body(tx: Transaction) -> int:
            p = await self.db.placements.find_one({"_id": placement_id}, session=tx.session)
            if p is None or "ended_ms" in p or int(p.get("hours_billed", 0)) >= k:
                return 0
            await self.db.placements.update_one(
                {"_id": placement_id}, {"$set": {"hours_billed": k}}, session=tx.session
            )
            at = from_ms(int(p["started_ms"]) + k * MS_PER_HOUR)
            return await self._settle_worker(tx, p, f"h{k}", k * MS_PER_HOUR, at, MS_PER_HOUR)

        async with self.lock:
            return await self._write(body)

    # --- devices (R-BILL-3) -------------------------------------------------------------

    async def device_added(self, evt: DeviceAdded) -> int:
        async with self.lock:
            doc = await self.db.devices.find_one({"_id": evt.device_id}) or {}
            added = to_ms(evt.at)
            if "added_ms" in doc and int(doc["added_ms"]) <= added:
                return 0  # a replay (or a later re-add of the same id: the first span stands)
            doc.update({"_id": evt.device_id, "account": evt.account, "added_ms": added})
            await self.db.devices.replace_one({"_id": evt.device_id}, doc, upsert=True)
            return await self._resettle_device_days(evt.account, day_of(added))

    async def device_removed(self, evt: DeviceRemoved) -> int:
        async with self.lock:
            doc = await self.db.devices.find_one({"_id": evt.device_id}) or {}
            removed = to_ms(evt.at)
            if "removed_ms" in doc and int(doc["removed_ms"]) <= removed:
                return 0
            doc.update({"_id": evt.device_id, "account": evt.account, "removed_ms": removed})
            await self.db.devices.replace_one({"_id": evt.device_id}, doc, upsert=True)
            return await self._resettle_device_days(evt.account, day_of(removed))

    async def _resettle_device_days(self, account: str, first: date) -> int:
        """A device event for a day already charged corrects that day and the ones after it.
        The caller holds the lock, so the cursor cannot move meanwhile."""
        cursor = await self._cursor(f"devicefee:{account}")
        if cursor is None or first >= cursor:
            return 0
        return sum([await self._settle_device_day(account, d) for d in days(first, cursor)])

    async def _spans(self, account: str, tx: Transaction | None = None) -> list[DeviceSpan]:
        docs = self.db.devices.find({"account": account}, session=tx.session if tx else None)
        return [
            DeviceSpan(d["_id"], int(d["added_ms"]), d.get("removed_ms"))
            for d in await docs.to_list(None)
            if "added_ms" in d
        ]

    async def _settle_device_day(self, account: str, day: date) -> int:
        group = f"devicefee:{account}:{day.isoformat()}"

        async def body(tx: Transaction) -> int:
            count = devices_charged(await self._spans(account, tx), day)
            target = device_fee_postings(account, count, day) if count else []
            have = await ledger.posted(self.db, group, tx)
            entries = await ledger.write_stage(
                self.db,
                tx,
                group=group,
                stage=next_revision(have),
                postings=delta(target, have),
                at=from_ms(day_bounds_ms(day)[0]),
                recorded_at=self.clock(),
                meta={
                    "day": day.isoformat(),
                    "devices": count,
                    "memo": f"{count} device(s) on {day.isoformat()}",
                },
            )
            return len(entries)

        return await self._write(body)

    async def charge_device_days(self, today: date) -> int:
        """Charge every finished day not charged yet, for every account with devices."""
        written = 0
        for account in sorted(set(await self.db.devices.distinct("account"))):
            if self.stopping:
                break
            async with self.lock:  # the days and the cursor move together
                spans = await self._spans(account)
                if not spans:
                    continue
                key = f"devicefee:{account}"
                first = await self._cursor(key) or min(day_of(s.added_ms) for s in spans)
                for d in days(first, today):
                    written += await self._settle_device_day(account, d)
                if first < today:
                    await self._set_cursor(key, today)
        return written

    # --- payouts (R-PROV-1) -------------------------------------------------------------

    async def provider_enabled(self, evt: ProviderEnabled) -> None:
        if evt.payment_mode != PaymentMode.credits:
            log.info("%s pays by %s: no payouts", evt.account, evt.payment_mode)
            return
        since = to_ms(evt.at)
        async with self.lock:
            doc = await self.db.payout_accounts.find_one({"_id": evt.account})
            if doc is None or int(doc["since_ms"]) > since:
                await self.db.payout_accounts.replace_one(
                    {"_id": evt.account}, {"_id": evt.account, "since_ms": since}, upsert=True
                )

    async def make_payouts(self, today: date) -> int:
        """Pay each `credits` account its earnings up to the end of every finished day.

        The latest finished day is settled again on every tick, so an earning learned late is
        paid within one tick rather than a day later.
        """
        written = 0
        yesterday = today - timedelta(days=1)
        for acc in await self.db.payout_accounts.find({}).to_list(None):
            if self.stopping:
                break
            account, key = acc["_id"], f"payout:{acc['_id']}"
            since = day_of(int(acc["since_ms"]))
            async with self.lock:
                first = max(since, min(await self._cursor(key) or since, yesterday))
                for d in days(first, today):
                    written += await self._settle_payout(account, d)
                if first < today:
                    await self._set_cursor(key, today)
        return written

    async def _settle_payout(self, account: str, day: date) -> int:
        group = f"payout:{account}:{day.isoformat()}"
        sub = earnings_account(account)
        end_ms = day_bounds_ms(day)[1]

        async def body(tx: Transaction) -> int:
            earned = paid = 0
            async for e in self.db.ledger.find({"account": sub}, session=tx.session):
                if e["kind"] == "payout":
                    paid -= int(e["amount_micro"])
                elif int(e["at_ms"]) < end_ms:
                    earned += int(e["amount_micro"])
            amount = earned - paid
            if amount == 0:
                return 0
            have = await ledger.posted(self.db, group, tx)
            entries = await ledger.write_stage(
                self.db,
                tx,
                group=group,
                stage=next_revision(have),
                postings=[Posting(sub, -amount, "payout"), Posting(account, amount, "payout")],
                at=from_ms(end_ms),
                recorded_at=self.clock(),
                meta={
                    "day": day.isoformat(),
                    "owner": account,
                    "memo": f"earnings up to the end of {day.isoformat()}",
                },
            )
            return len(entries)

        return await self._write(body)

    # --- the clock ----------------------------------------------------------------------

    async def tick(self, now: datetime | None = None) -> int:
        """Settle everything due at `now` (the clock by default); safe to repeat or to run late."""
        now = now or self.clock()
        today = day_of(to_ms(now))
        written = await self.bill_running_hours(to_ms(now))
        written += await self.charge_device_days(today)
        written += await self.make_payouts(today)
        return written

    async def _cursor(self, key: str) -> date | None:
        doc = await self.db.cursors.find_one({"_id": key})
        return date.fromisoformat(doc["next_day"]) if doc else None

    async def _set_cursor(self, key: str, day: date) -> None:
        await self.db.cursors.replace_one(
            {"_id": key}, {"_id": key, "next_day": day.isoformat()}, upsert=True
        )


def _worker_targets(p: Doc, duration_ms: int) -> list[tuple[str, list[Posting]]]:
    """The charge groups of one placement and their totals over `duration_ms` of running."""
    groups = [
        (
            f"{p['charge']}:{p['_id']}",
            usage_postings(
                charge=p["charge"],
                payer=p["payer"],
                node_owner=p["node_owner"],
                gpu_model=p["gpu_model"],
                rate=Decimal(p["rate"]),
                gpu_count=int(p["gpu_count"]),
                duration_ms=duration_ms,
                gpu_fraction=Decimal(p["gpu_fraction"]) if p.get("gpu_fraction") else None,
            ),
        )
    ]
    creator, job_type = p.get("creator", ""), p.get("job_type", "training")
    if is_federated(creator, p["payer"], job_type):
        groups.append(
            (
                f"federated:{p['_id']}",
                federated_postings(creator=creator, job_type=job_type, duration_ms=duration_ms),
            )
        )
    return groups


def _worker_memo(p: Doc, group: str, stage: str, duration_ms: int) -> str:
    span = f"run of {duration_ms / 1000:.3f}s" if stage == "end" else f"hour {stage[1:]}"
    if group.startswith("federated:"):
        return f"federated {p.get('job_type')} fee, {span}"
    return f"{p['gpu_count']} x {p['gpu_model']} at {p['rate']}/GPU-hour, {span}" + (
        f" on {p['node_owner']}'s node" if p["charge"] == "market" else ""
    )


def _ms(at: datetime | None) -> int | None:
    return None if at is None else to_ms(at)


def _placed_ms(placement: Doc) -> int | None:
    placed = placement.get("placed_at")
    return to_ms(placed) if isinstance(placed, datetime) else None


def _from_its_node(placement: Doc, minion_id: str) -> bool:
    """Billing takes a worker fact only from the node the placement named (its subject
    carries the reporting node, which only that node may publish: gpufleet_auth)."""
    expected = placement.get("minion_id")
    if expected is None or expected == minion_id:  # None: placed before this was kept
        return True
    log.warning(
        "placement %s: worker fact from node %s, placed on %s: ignored",
        placement["_id"],
        minion_id,
        expected,
    )
    return False


__all__ = ["PLATFORM", "Billing", "NotYetKnown"]
