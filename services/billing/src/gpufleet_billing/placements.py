"""Workers' runs: usage, market price and earnings, the federated fee (R-BILL-1, 2, 4).

A placement (WorkerPlaced) carries the rate locked at placement; the node's WorkerStarted
starts the clock's hourly billing, its WorkerFinished settles the run to its exact total.
A worker fact whose placement billing has not recorded is parked (the `parked` collection)
and applied when the placement arrives: see service.py for when that can happen at all.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal
from typing import TypeVar

from gpufleet_contracts.jobs import WorkerFinished, WorkerPlaced, WorkerStarted
from gpufleet_store import Doc, Transaction
from pymongo import UpdateOne

from . import ledger
from .fees import MS_PER_HOUR, Posting, federated_postings, is_federated, usage_postings
from .keeper import Keeper
from .periods import from_ms, full_hours, length_ms, run_end_ms, run_start_ms, to_ms
from .settle import delta

log = logging.getLogger("gpufleet.billing")

MAX_HOURS_PER_TICK = 24  # hours the clock bills for one placement in one tick; later ticks go on
FINISHED_PER_TRANSACTION = 64  # runs settled in one transaction (its outbox: ~3 events each)
STARTED, FINISHED = "started", "finished"  # the kinds of a parked fact, applied in this order
Fact = TypeVar("Fact", WorkerStarted, WorkerFinished)


class Placements(Keeper):
    async def worker_placed(self, evt: WorkerPlaced) -> None:
        await self.workers_placed([evt])

    async def workers_placed(self, evts: Sequence[WorkerPlaced]) -> None:
        """Record placements (the first copy of each stands), then apply what was parked
        for them."""
        if not evts:
            return
        await self.db.placements.bulk_write(
            [
                UpdateOne({"_id": e.placement_id}, {"$setOnInsert": _placement_doc(e)}, upsert=True)
                for e in evts
            ],
            ordered=True,
        )
        ids = list({e.placement_id: None for e in evts})
        waiting = await self.db.parked.distinct("placement_id", {"placement_id": {"$in": ids}})
        for placement_id in ids:
            if placement_id in waiting:
                await self._unpark(placement_id)

    async def worker_started(self, evt: WorkerStarted, received_at: datetime | None = None) -> None:
        """Record the start: from now on the clock bills each full running hour.

        The node's `started_at` is clamped to [placed_at, received_at] (`received_at`: the
        stream's timestamp of the event, the same on a replay; None only in direct calls)."""
        await self.workers_started([(evt, received_at)])

    async def workers_started(self, facts: Sequence[tuple[WorkerStarted, datetime | None]]) -> None:
        """`worker_started` for many, in one read and one write."""
        ops = []
        for evt, received_at, p in await self._known(STARTED, facts):
            started_ms = run_start_ms(to_ms(evt.started_at), _placed_ms(p), _ms(received_at))
            ops.append(
                UpdateOne(
                    # not once settled: a late start of a run the scheduler closed (its node
                    # was declared lost) is no run to bill
                    {
                        "_id": evt.placement_id,
                        "started_ms": {"$exists": False},
                        "ended_ms": {"$exists": False},
                    },
                    {"$set": {"started_ms": started_ms}},
                )
            )
        if ops:
            await self.db.placements.bulk_write(ops, ordered=True)

    async def worker_finished(
        self, evt: WorkerFinished, received_at: datetime | None = None
    ) -> int:
        """Settle a run to its exact total; returns the entries written (0 on a replay).

        The node's times are clamped: the start to [placed_at, received_at], the end to
        [start, received_at] (`received_at` as for `worker_started`)."""
        return await self.workers_finished([(evt, received_at)])

    async def workers_finished(
        self, facts: Sequence[tuple[WorkerFinished, datetime | None]]
    ) -> int:
        """`worker_finished` for many: up to FINISHED_PER_TRANSACTION runs settled in one
        transaction (one read of their placements, one of their groups' entries, one insert),
        instead of a handful of round trips each; returns the entries written."""
        written = 0
        for i in range(0, len(facts), FINISHED_PER_TRANSACTION):
            written += await self._finish(facts[i : i + FINISHED_PER_TRANSACTION])
        return written

    async def _finish(self, facts: Sequence[tuple[WorkerFinished, datetime | None]]) -> int:
        known = [(evt, at) for evt, at, _ in await self._known(FINISHED, facts)]
        if not known:
            return 0

        async def body(tx: Transaction) -> int:
            placements = await self._placements({e.placement_id for e, _ in known}, tx)
            updates, runs = [], []
            for evt, received_at in known:
                p = placements.get(evt.placement_id)
                if p is None or "ended_ms" in p:
                    continue  # already settled: a redelivery or a replay
                fields, run = _end_of_run(p, evt, _ms(received_at))
                p.update(fields)  # a second copy in this batch sees it settled
                updates.append(UpdateOne({"_id": evt.placement_id}, {"$set": fields}))
                if run is not None:  # else never ran: nothing to charge
                    runs.append((p, *run))
            if updates:
                await self.db.placements.bulk_write(updates, ordered=True, session=tx.session)
            return await self._settle_runs(tx, "end", runs)

        async with self.lock:
            return await self._write(body)

    async def _known(
        self, kind: str, facts: Sequence[tuple[Fact, datetime | None]]
    ) -> list[tuple[Fact, datetime | None, Doc]]:
        """The facts whose placement is recorded, with it, from the node it named; the
        others are parked (no placement yet) or ignored (another node's)."""
        if not facts:
            return []
        found = await self._placements({e.placement_id for e, _ in facts})
        known = []
        for evt, received_at in facts:
            p = found.get(evt.placement_id)
            if p is None:
                await self._park(kind, evt, received_at)
            elif _from_its_node(p, evt.minion_id):
                known.append((evt, received_at, p))
        return known

    async def _placements(self, ids: set[str], tx: Transaction | None = None) -> dict[str, Doc]:
        session = tx.session if tx is not None else None
        docs = self.db.placements.find({"_id": {"$in": sorted(ids)}}, session=session)
        return {str(p["_id"]): p for p in await docs.to_list(None)}

    # --- facts for a placement not recorded (yet) ---------------------------------------

    async def _park(
        self, kind: str, evt: WorkerStarted | WorkerFinished, received_at: datetime | None
    ) -> None:
        """Keep a fact whose placement billing has not seen; the first copy stands (a
        redelivery or a replay parks nothing new). Never retried: applied by `_unpark`."""
        log.warning(
            "worker %s of placement %s (node %s): no such placement recorded; parked",
            kind,
            evt.placement_id,
            evt.minion_id,
        )
        await self.db.parked.update_one(
            {"_id": f"{kind}:{evt.placement_id}"},
            {
                "$setOnInsert": {
                    "placement_id": evt.placement_id,
                    "kind": kind,
                    "body": evt.model_dump(mode="json"),
                    "received_at": received_at,
                }
            },
            upsert=True,
        )

    async def _unpark(self, placement_id: str) -> None:
        """Apply the facts parked for a placement now recorded: the start, then the end
        (both idempotent, so a crash between applying and deleting is harmless)."""
        found = await self.db.parked.find({"placement_id": placement_id}).to_list(None)
        for doc in sorted(found, key=lambda d: [STARTED, FINISHED].index(d["kind"])):
            if doc["kind"] == STARTED:
                await self.worker_started(
                    WorkerStarted.model_validate(doc["body"]), doc.get("received_at")
                )
            else:
                await self.worker_finished(
                    WorkerFinished.model_validate(doc["body"]), doc.get("received_at")
                )
            await self.db.parked.delete_one({"_id": doc["_id"]})

    # --- settling -----------------------------------------------------------------------

    async def _settle_runs(
        self, tx: Transaction, stage: str, runs: Sequence[tuple[Doc, int, datetime, int]]
    ) -> int:
        """Bring every charge group of each run (placement, duration_ms, at, covered_ms) to
        its total over its duration, as stage `stage`: one read, one insert."""
        targets = [(run, worker_targets(run[0], run[1])) for run in runs]
        groups = [group for _, tg in targets for group, _ in tg]
        if not groups:
            return 0
        posted = await ledger.posted_in(self.db, groups, tx)
        entries: list[Doc] = []
        for (p, duration_ms, at, covered), tg in targets:
            meta = _run_meta(p, duration_ms, covered)
            for group, target in tg:
                entries += ledger.stage_entries(
                    group=group,
                    stage=stage,
                    postings=delta(target, posted[group]),
                    at=at,
                    recorded_at=self.clock(),
                    meta={**meta, "memo": _worker_memo(p, group, stage, duration_ms)},
                )
        await ledger.insert(self.db, tx, entries)
        return len(entries)

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
            return await self._settle_runs(tx, f"h{k}", [(p, k * MS_PER_HOUR, at, MS_PER_HOUR)])

        async with self.lock:
            return await self._write(body)


def _placement_doc(evt: WorkerPlaced) -> Doc:
    return {
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
        "cpu_count": evt.cpu_count,  # a CPU-only worker's: rate per CPU-hour
        "hours_billed": 0,
    }


def _end_of_run(
    p: Doc, evt: WorkerFinished, received_ms: int | None
) -> tuple[Doc, tuple[int, datetime, int] | None]:
    """The fields that close placement `p`, and its run to settle (duration_ms, at,
    covered_ms: what the hourly stages have not covered), or None if it never started."""
    started_ms = p.get("started_ms")
    if evt.started_at is not None and started_ms is None:  # else: bounded at its receipt
        started_ms = run_start_ms(to_ms(evt.started_at), _placed_ms(p), received_ms)
    length = length_ms(evt.started_at, evt.ended_at) if evt.started_at is not None else None
    ended_ms = run_end_ms(to_ms(evt.ended_at), started_ms, received_ms, length)
    fields: Doc = {"ended_ms": ended_ms}
    if started_ms is None:
        return fields, None
    fields["started_ms"] = started_ms
    duration = max(0, ended_ms - started_ms)
    covered = duration - int(p.get("hours_billed", 0)) * MS_PER_HOUR
    return fields, (duration, from_ms(ended_ms), covered)


def _run_meta(p: Doc, duration_ms: int, covered: int) -> Doc:
    return {
        "job_id": p["job_id"],
        "worker": p["worker"],
        "placement_id": p["_id"],
        "node_id": p.get("node_id", ""),
        "region": p.get("region", ""),
        "gpu_count": p["gpu_count"],
        "gpu_model": p["gpu_model"],
        "cpu_count": int(p.get("cpu_count") or 0),
        "rate": p["rate"],
        "job_type": p.get("job_type", "training"),
        "covered_ms": covered,
        "duration_ms": duration_ms,
    }


def worker_targets(p: Doc, duration_ms: int) -> list[tuple[str, list[Posting]]]:
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
                cpu_count=int(p.get("cpu_count") or 0),
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
    what = (
        f"{p['cpu_count']} CPUs at {p['rate']}/CPU-hour"
        if p.get("cpu_count")
        else f"{p['gpu_count']} x {p['gpu_model']} at {p['rate']}/GPU-hour"
    )
    return f"{what}, {span}" + (f" on {p['node_owner']}'s node" if p["charge"] == "market" else "")


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
