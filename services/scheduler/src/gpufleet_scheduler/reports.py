"""Workers started and finished as their nodes report them, a batch at a time.

The worker stream's consumer hands over every report it fetched at once (up to
`REPORTS_BATCH`, in stream order: a worker's start before its finish), and the batch is
applied in one transaction: the jobs read, each report applied in order (each state a job
goes through is recorded: `running`, then `finished`, even within one batch), the jobs
written, the finished placements' claims released. The consumer acks the batch after the
commit; a redelivered report changes nothing (its worker is past that point). Then the
freed GPUs go back to the fleet in memory and a placement pass is asked for, not waited
for. Before, each report was a read, a transaction and a whole placement pass awaited
before the next report was read: a median 12.8 s from WorkerFinished to the job shown
finished at 6 jobs/s (issue 15).

A report counts only when it arrived on the subject of the node its body names (the only
one that node may publish) and that node is the one the placement named; a report of a
placement that is no longer the worker's (its node was lost and the worker requeued) is
ignored, here and in billing (lifecycle.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from gpufleet_bus import Delivery, on_its_own_subject
from gpufleet_contracts.clock import aware
from gpufleet_contracts.jobs import WorkerFinished, WorkerStarted, WorkerState
from gpufleet_store import Doc, Transaction
from gpufleet_telemetry.instruments import METRICS
from pymongo import ReplaceOne

from . import jobdoc
from .passes import Passes
from .state import StaleJob, State

REPORTS_BATCH = 256  # reports fetched and applied at once (app.py)
# After a batch that was not full, the next fetch waits this long: under load the reports
# come in fewer transactions (and placement passes); a quiet node's report goes at once.
REPORTS_LINGER_S = 0.2
Report = WorkerStarted | WorkerFinished


@dataclass
class Applied:
    """What a batch changed: the jobs to write and the GPU slots freed per node."""

    jobs: dict[str, Doc] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)  # each job's version as read
    freed: list[tuple[str, list[tuple[int, int]]]] = field(default_factory=list)
    placements: list[str] = field(default_factory=list)  # finished: their claims go
    finished: list[str] = field(default_factory=list)  # states, for the metrics


class Reports:
    def __init__(self, state: State, passes: Passes) -> None:
        self.state = state
        self.passes = passes
        self.batches = 0  # applied so far (tests, benchmarks)

    async def reported(self, batch: Sequence[tuple[Report, Delivery]]) -> None:
        """Apply a batch of reports (see the module's docstring)."""
        facts = [
            (evt, d.received_at or self.state.clock())
            for evt, d in batch
            if on_its_own_subject(d.subject, evt.minion_id)
        ]
        if facts and await self.apply(facts):
            self.passes.request_pass()  # not awaited: the next batch is read meanwhile

    async def apply(self, facts: Sequence[tuple[Report, datetime]]) -> bool:
        """Apply reports in one transaction; True when some GPUs were freed."""
        st = self.state
        ids = sorted({evt.job_id for evt, _ in facts})
        async with st.lock:

            async def body(tx: Transaction) -> Applied:
                found = await st.db.jobs.find({"_id": {"$in": ids}}, session=tx.session).to_list(
                    None
                )
                jobs = {j["_id"]: j for j in found}
                out = Applied()
                for evt, received in facts:
                    job = jobs.get(evt.job_id)
                    if job is None:
                        continue
                    version = int(job["version"])
                    at, reason = (
                        started(job, evt, received)
                        if isinstance(evt, WorkerStarted)
                        else finished(job, evt, received, out)
                    )
                    if at is None:
                        continue  # unknown, superseded or already past this point
                    out.versions.setdefault(job["_id"], version)
                    out.jobs[job["_id"]] = job
                    st.bump(tx, job, at, reason)
                if not out.jobs:
                    return out
                rev = await st.next_rev(tx)
                writes = []
                for job_id, job in out.jobs.items():
                    job["rev"] = rev
                    writes.append(ReplaceOne({"_id": job_id, "version": out.versions[job_id]}, job))
                res = await st.db.jobs.bulk_write(writes, ordered=False, session=tx.session)
                if res.matched_count != len(writes):
                    raise StaleJob(",".join(out.jobs))  # another writer came between
                if out.placements:
                    await st.db.claims.delete_many(
                        {"placement_id": {"$in": out.placements}}, session=tx.session
                    )
                return out

            done = await st.store.transaction(body)
            if not done.jobs:
                return False
            self.batches += 1
            for state in done.finished:
                METRICS.worker_runs.add(1, {"state": state})
            for node_id, slots in done.freed:
                if st.loaded and st.fleet.node(node_id) is not None:
                    st.fleet.release(node_id, slots)
            jobs = list(done.jobs.values())
            await st.changed(jobs, [] if st.loaded else sorted({n for n, _ in done.freed}))
            st.committed(jobs[0]["rev"])
        return bool(done.freed)


def started(job: Doc, evt: WorkerStarted, received: datetime) -> tuple[datetime | None, None]:
    """A worker's start: `running`, its start kept within [placed_at, received] (a job's
    shown run time; billing clamps the same). Returns when, or None: nothing to do."""
    w = jobdoc.find_worker(job, evt.worker, evt.placement_id)
    if w is None or w["state"] != WorkerState.placed.value:
        return None, None
    if not jobdoc.reported_by_its_node(w, evt.minion_id):
        return None, None
    at = clamp_time(evt.started_at, start_floor(w.get("placed_at"), received), received)
    w["state"] = WorkerState.running.value
    w["started_at"] = at
    return at, None


def finished(
    job: Doc, evt: WorkerFinished, received: datetime, out: Applied
) -> tuple[datetime | None, str | None]:
    """A worker's end, clamped as a start is, to [start, received]; a worker that finished
    without a start seen (it failed to start) keeps the start the node claims, if any.
    Returns when and why, or None: nothing to do."""
    w = jobdoc.find_worker(job, evt.worker, evt.placement_id)
    if w is None or WorkerState(w["state"]).terminal:
        return None, None
    if not jobdoc.reported_by_its_node(w, evt.minion_id):
        return None, None
    claimed = evt.started_at
    start = w.get("started_at") or (
        clamp_time(claimed, start_floor(w.get("placed_at"), received), received)
        if claimed
        else None
    )
    ended = clamp_time(ended_claim(evt, start), start, received)
    if w.get("node_id") is not None:
        out.freed.append((str(w["node_id"]), jobdoc.held_slots(w)))
    out.placements.append(evt.placement_id)
    out.finished.append(evt.state.value)
    w.update(
        state=evt.state.value,
        exit_code=evt.exit_code,
        reason=evt.reason,
        ended_at=ended,
        started_at=start,
        log_tail=evt.log_tail[-4000:],
    )
    reason = evt.reason or (
        f"worker {evt.worker} exited with code {evt.exit_code}"
        if evt.state is WorkerState.failed
        else None
    )
    return ended, reason


def start_floor(placed_at: object, received: datetime | None) -> object:
    """The least a start may be: its placement, unless that is after the start's receipt
    (the scheduler's clock ahead of the bus's: the bound would erase the run), as billing."""
    ahead = (
        isinstance(placed_at, datetime)
        and received is not None
        and aware(placed_at) > aware(received)
    )
    return None if ahead else placed_at


def ended_claim(evt: WorkerFinished, start: object) -> datetime:
    """The end a node claims, as its run's length on its own clock from the start we keep:
    the node's clock offset cancels out (an agent an hour behind would otherwise have
    every run shorter than an hour clamped to nothing). Clamped by the caller."""
    if evt.started_at is None or not isinstance(start, datetime):
        return evt.ended_at
    return aware(start) + (aware(evt.ended_at) - aware(evt.started_at))


def clamp_time(at: datetime, lo: object, hi: datetime | None) -> datetime:
    """A node's claimed time kept within [lo, hi]: not after `hi` (when its report was
    received), not before `lo` (a stored time: the placement, or the start)."""
    at = aware(at)
    if hi is not None:
        at = min(at, aware(hi))
    if isinstance(lo, datetime):
        at = max(at, aware(lo))
    return at
