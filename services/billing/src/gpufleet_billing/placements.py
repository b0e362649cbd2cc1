"""Workers' runs: usage, market price and earnings, the federated fee (R-BILL-1, 2, 4).

A placement (WorkerPlaced) carries the rate locked at placement; the node's WorkerStarted
starts the clock's hourly billing, its WorkerFinished settles the run to its exact total.
A worker fact whose placement billing has not recorded is parked (the `parked` collection)
and applied when the placement arrives: see service.py for when that can happen at all.
"""

from __future__ import annotations

import logging
from datetime import datetime
from decimal import Decimal

from gpufleet_contracts.jobs import WorkerFinished, WorkerPlaced, WorkerStarted
from gpufleet_store import Doc, Transaction

from . import ledger
from .fees import MS_PER_HOUR, Posting, federated_postings, is_federated, usage_postings
from .keeper import Keeper
from .periods import from_ms, full_hours, run_end_ms, run_start_ms, to_ms
from .settle import delta

log = logging.getLogger("gpufleet.billing")

MAX_HOURS_PER_TICK = 24  # hours the clock bills for one placement in one tick; later ticks go on
STARTED, FINISHED = "started", "finished"  # the kinds of a parked fact, applied in this order


class Placements(Keeper):
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
                    "cpu_count": evt.cpu_count,  # a CPU-only worker's: rate per CPU-hour
                    "hours_billed": 0,
                }
            },
            upsert=True,
        )
        await self._unpark(evt.placement_id)

    async def worker_started(self, evt: WorkerStarted, received_at: datetime | None = None) -> None:
        """Record the start: from now on the clock bills each full running hour.

        The node's `started_at` is clamped to [placed_at, received_at] (`received_at`: the
        stream's timestamp of the event, the same on a replay; None only in direct calls)."""
        p = await self.db.placements.find_one({"_id": evt.placement_id})
        if p is None:
            await self._park(STARTED, evt, received_at)
            return
        if not _from_its_node(p, evt.minion_id):
            return
        started_ms = run_start_ms(to_ms(evt.started_at), _placed_ms(p), _ms(received_at))
        await self.db.placements.update_one(
            # not once settled: a late start of a run the scheduler closed (its node was
            # declared lost) is no run to bill
            {
                "_id": evt.placement_id,
                "started_ms": {"$exists": False},
                "ended_ms": {"$exists": False},
            },
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
            await self._park(FINISHED, evt, received_at)
            return 0
        if not _from_its_node(placed, evt.minion_id):
            return 0

        async def body(tx: Transaction) -> int:
            p = await self.db.placements.find_one({"_id": evt.placement_id}, session=tx.session)
            if p is None or "ended_ms" in p:
                return 0  # already settled: a redelivery or a replay
            received_ms = _ms(received_at)
            started_ms = p.get("started_ms")
            if evt.started_at is not None and started_ms is None:  # else: bounded at its receipt
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
            "cpu_count": int(p.get("cpu_count") or 0),
            "rate": p["rate"],
            "job_type": p.get("job_type", "training"),
            "covered_ms": covered,
            "duration_ms": duration_ms,
        }
        for group, target in worker_targets(p, duration_ms):
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
