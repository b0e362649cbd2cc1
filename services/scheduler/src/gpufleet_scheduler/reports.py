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

Reports come from the REPORTS stream, a work queue that keeps nothing once read: a report
that changed a worker (its start, its end) is stated again, in the same transaction, on the
`kept` subject of its node (`subjects.kept`, stream EVENTS: what billing reads and the
history keeps), under an id of its placement. So the event history holds one start and one
end per placement whatever a node sends; a finish whose start was not seen (redelivered
behind it, after a paused leader had fetched it) states the start it claims first. A fact
of a node about a worker it was never placed on (another node's, another account's, none at
all), or whose body names another node, is not kept and is noticed: a dead-letter record
naming the node and why, and a log line, at once for a node's first, then at most once a
minute per node with the count since (gpufleet_bus.notices), so that a node's flood is no
flood of the DLQ or of the log.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from gpufleet_bus import Delivery, emit, node_of, tracing
from gpufleet_bus.deadletter import dead_letter_bytes
from gpufleet_bus.notices import Notice, Notices
from gpufleet_contracts import subjects
from gpufleet_contracts.clock import aware
from gpufleet_contracts.jobs import (
    WorkerFinished,
    WorkerStaging,
    WorkerStarted,
    WorkerState,
    WorkerUploading,
)
from gpufleet_contracts.serving import EndpointMetered, EndpointReady
from gpufleet_store import Doc, Transaction
from gpufleet_telemetry.instruments import METRICS
from nats.js import JetStreamContext
from pymongo import ReplaceOne

from . import jobdoc, serving
from .passes import Passes
from .state import StaleJob, State

log = logging.getLogger("gpufleet.scheduler.reports")

REPORTS_BATCH = 256  # reports fetched and applied at once (app.py)
# After a batch that was not full, the next fetch waits this long: under load the reports
# come in fewer transactions (and placement passes); a quiet node's report goes at once.
REPORTS_LINGER_S = 0.2
Report = (
    WorkerStarted
    | WorkerUploading
    | WorkerStaging
    | WorkerFinished
    | EndpointReady
    | EndpointMetered
)
# What is shown on the job and never kept in the history: progress, an endpoint's readiness
# and its requests.
Shown = WorkerStaging | EndpointReady | EndpointMetered
JetStream = Callable[[], Awaitable[JetStreamContext]]
IGNORED = "ignored"  # the reason of a dead letter of a report not kept
NOT_PLACED = "worker:not-placed-on-node"
OTHER_NODE = "worker:body-names-another-node"


@dataclass(frozen=True)
class Ignored:
    """A report that is not kept, from `node`, and why: noticed (`Reports.notice`)."""

    report: Report
    delivery: Delivery
    node: str
    rule: str
    why: str


@dataclass
class Applied:
    """What a batch changed: the jobs to write and the GPU slots freed per node."""

    jobs: dict[str, Doc] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)  # each job's version as read
    freed: list[tuple[str, list[tuple[int, int]]]] = field(default_factory=list)
    placements: list[str] = field(default_factory=list)  # finished: their claims go
    finished: list[str] = field(default_factory=list)  # states, for the metrics
    ignored: list[Ignored] = field(default_factory=list)  # facts of workers not the node's


class Reports:
    def __init__(
        self,
        state: State,
        passes: Passes,
        jetstream: JetStream | None = None,
        notices: Notices | None = None,
    ) -> None:
        self.state = state
        self.passes = passes
        self.jetstream = jetstream  # where dead letters go (None: logged only)
        self.notices = notices or Notices()  # per node: what is noticed of its rubbish
        self._examples: dict[str, Ignored] = {}  # per node: its latest, for a late notice
        self.batches = 0  # applied so far (tests, benchmarks)
        self.ignored = 0  # reports not kept so far (tests, benchmarks)

    async def reported(self, batch: Sequence[tuple[Report, Delivery]]) -> None:
        """Apply a batch of reports (see the module's docstring)."""
        facts: list[tuple[Report, Delivery]] = []
        ignored: list[Ignored] = []
        for evt, d in batch:
            sender = node_of(d.subject) or subjects.NO_ACCOUNT
            if sender == evt.minion_id:
                facts.append((evt, d))
            else:
                why = f"its body names node {evt.minion_id}, not the node that sent it"
                ignored.append(Ignored(evt, d, sender, OTHER_NODE, why))
        if facts:
            freed, foreign = await self.apply(facts)
            ignored += foreign
            if freed:
                self.passes.request_pass()  # not awaited: the next batch is read meanwhile
        await self.notice(ignored)

    async def apply(self, facts: Sequence[tuple[Report, Delivery]]) -> tuple[bool, list[Ignored]]:
        """Apply reports in one transaction, stating each one that changed a worker on its
        node's `kept` subject; (whether some GPUs were freed, the facts of workers that were
        never their node's)."""
        st = self.state
        ids = sorted({evt.job_id for evt, _ in facts})
        async with st.lock:

            async def body(tx: Transaction) -> Applied:
                found = await st.db.jobs.find({"_id": {"$in": ids}}, session=tx.session).to_list(
                    None
                )
                jobs = {j["_id"]: j for j in found}
                out = Applied()
                for evt, d in facts:
                    job = jobs.get(evt.job_id)
                    if job is None or not placed_on(job, evt):
                        why = "no worker with this placement was placed on the node"
                        out.ignored.append(Ignored(evt, d, evt.minion_id, NOT_PLACED, why))
                        continue
                    received = d.received_at or st.clock()
                    version = int(job["version"])
                    start_unseen = unseen_start(job, evt)
                    if isinstance(evt, Shown):
                        if shown(job, evt):  # shown on the job, never kept
                            out.versions.setdefault(job["_id"], version)
                            out.jobs[job["_id"]] = job
                            job["version"] = version + 1
                        continue
                    if isinstance(evt, WorkerStarted):
                        at, reason = started(job, evt, received)
                    elif isinstance(evt, WorkerUploading):
                        at, reason = uploading(job, evt, received)
                    else:
                        at, reason = finished(job, evt, received, out)
                    if at is None:
                        continue  # superseded or already past this point
                    out.versions.setdefault(job["_id"], version)
                    out.jobs[job["_id"]] = job
                    st.bump(tx, job, at, reason)
                    trace = tracing.within(job.get("trace"), d.trace)
                    if start_unseen is not None:
                        # Its start came late or not at all (a redelivery behind the
                        # finish): the start the finish carries is the one kept, and a
                        # late report of it finds the worker past that point.
                        emit(
                            tx,
                            start_unseen,
                            f"kept:started:{evt.placement_id}",
                            subject=subjects.kept("started", evt.minion_id),
                            trace=trace,
                        )
                    fact = FACTS[type(evt)]
                    emit(
                        tx,
                        evt,
                        f"kept:{fact}:{evt.placement_id}",
                        subject=subjects.kept(fact, evt.minion_id),
                        trace=trace,
                    )
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
                return False, done.ignored
            self.batches += 1
            for state in done.finished:
                METRICS.worker_runs.add(1, {"state": state})
            for node_id, slots in done.freed:
                if st.loaded and st.fleet.node(node_id) is not None:
                    st.fleet.release(node_id, slots)
            jobs = list(done.jobs.values())
            await st.changed(jobs, [] if st.loaded else sorted({n for n, _ in done.freed}))
            st.committed(jobs[0]["rev"])
        return bool(done.freed), done.ignored

    async def notice(self, ignored: Sequence[Ignored]) -> None:
        """Reports not kept, noticed per node (see the module's docstring): the first of a
        node at once, then one dead letter and one log line a minute, with the count."""
        self.ignored += len(ignored)
        counts: dict[str, int] = {}
        for item in ignored:
            counts[item.node] = counts.get(item.node, 0) + 1
            self._examples.pop(item.node, None)
            self._examples[item.node] = item  # the latest last: the oldest go first
        while len(self._examples) > self.notices.max_keys:
            del self._examples[next(iter(self._examples))]
        notices = [n for node, c in counts.items() if (n := self.notices.note(node, c))]
        notices += [n for n in self.notices.due() if n.key not in counts]
        for notice in notices:
            example = self._examples.get(notice.key)
            log.warning(
                "node %s: %s report(s) not kept%s",
                notice.key,
                notice.text(),
                f" ({example.why}, e.g. a {example.report.TYPE})" if example else "",
            )
            if example is not None:
                await self._dead_letter(example, notice)

    async def _dead_letter(self, item: Ignored, notice: Notice) -> None:
        """A record of the node's ignored reports (one of them as it came, and how many),
        for the node's owner (`gpufleet dlq list`) and operators. It says nothing of the
        worker it named (whether it exists, whose it is)."""
        if self.jetstream is None:
            return
        owner = await self._owner(item.node)
        error = {
            "field": "placement_id" if item.rule == NOT_PLACED else "minion_id",
            "rule": item.rule,
            "message": f"node {item.node}: {item.why} ({notice.text()} so)",
        }
        record = json.loads(
            dead_letter_bytes(
                "scheduler",
                item.delivery.subject,
                item.report.to_bytes(),
                {"ce-id": item.delivery.id or "", "ce-type": item.report.TYPE},
                IGNORED,
                [error],
            )
        )
        record.update(account=owner, node=item.node, count=notice.count)
        try:
            js = await self.jetstream()
            await js.publish(
                subjects.dead_letter("scheduler", owner),
                json.dumps(record, default=str).encode(),
                stream=subjects.STREAM_DLQ,
                timeout=5.0,
            )
        except Exception as exc:  # the log line above is the notice then
            log.warning("dead letter of node %s's reports not kept: %s", item.node, exc)

    async def _owner(self, minion_id: str) -> str | None:
        """The account of a registered node (None: none registered under this id)."""
        doc = await self.state.db.nodes.find_one({"minion_id": minion_id}, {"owner": 1})
        owner = doc.get("owner") if doc else None
        return str(owner) if owner and subjects.ACCOUNT_RE.fullmatch(str(owner)) else None


def placed_on(job: Doc | None, evt: Report) -> bool:
    """Whether the node that reports was given this placement of this worker, now or in an
    earlier attempt (a placement it lost: its late report is stale, not a forgery). Anything
    else is a fact about a worker the node never ran."""
    if job is None:
        return False
    for w in job["workers"]:
        if w["index"] != evt.worker:
            continue
        if w.get("placement_id") == evt.placement_id:
            return bool(w.get("minion_id") == evt.minion_id)
        return any(
            a.get("placement_id") == evt.placement_id and a.get("minion_id") == evt.minion_id
            for a in w.get("attempts") or []
        )
    return False


FACTS: dict[type[Report], str] = {
    WorkerStarted: "started",
    WorkerUploading: "uploading",
    WorkerFinished: "finished",
}


def unseen_start(job: Doc, evt: Report) -> WorkerStarted | None:
    """The start a finish states for a worker whose own start was not seen (still
    `placed`), for the history: None when its start was kept or the node claims none."""
    if not isinstance(evt, WorkerFinished) or evt.started_at is None:
        return None
    w = jobdoc.find_worker(job, evt.worker, evt.placement_id)
    if w is None or w["state"] != WorkerState.placed.value:
        return None
    return WorkerStarted(
        job_id=evt.job_id,
        worker=evt.worker,
        placement_id=evt.placement_id,
        minion_id=evt.minion_id,
        started_at=evt.started_at,
    )


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


def uploading(job: Doc, evt: WorkerUploading, received: datetime) -> tuple[datetime | None, None]:
    """A running worker's command ended and its node puts its output: `uploading` (still
    holding its GPUs, still billed) until its finish. Returns when, or None: nothing to do."""
    w = jobdoc.find_worker(job, evt.worker, evt.placement_id)
    if w is None or w["state"] != WorkerState.running.value:
        return None, None
    if not jobdoc.reported_by_its_node(w, evt.minion_id):
        return None, None
    w["state"] = WorkerState.uploading.value
    return clamp_time(evt.at, w.get("started_at"), received), None


def staging(job: Doc, evt: WorkerStaging) -> bool:
    """How far the worker's sources (or its output) are: the latest report replaces the one
    before, on the worker alone (not its history). False: nothing to do (a worker that has
    ended, or a report older than the one shown)."""
    w = jobdoc.find_worker(job, evt.worker, evt.placement_id)
    if w is None or WorkerState(w["state"]).terminal:
        return False
    if not jobdoc.reported_by_its_node(w, evt.minion_id):
        return False
    shown = w.get("staging_at")
    if isinstance(shown, datetime) and aware(shown) >= aware(evt.at):
        return False
    w["staging"] = [item.model_dump(mode="json") for item in evt.items]
    w["staging_at"] = evt.at
    return True


def endpoint_ready(job: Doc, evt: EndpointReady) -> bool:
    """An endpoint's worker answers through its node's proxy (serving.py): only while it
    holds this placement. False: nothing to do."""
    w = jobdoc.find_worker(job, evt.worker, evt.placement_id)
    if w is None or WorkerState(w["state"]).terminal:
        return False
    if not jobdoc.reported_by_its_node(w, evt.minion_id):
        return False
    return serving.ready(w, evt)


def endpoint_metered(job: Doc, evt: EndpointMetered) -> bool:
    """The requests a placement's proxy let through (serving.py), also after the worker
    ended or lost that placement (its last count comes then): `placed_on` has checked that
    the placement was this node's. False: nothing to do."""
    w = next((w for w in job["workers"] if w["index"] == evt.worker), None)
    return w is not None and serving.metered(w, evt)


def shown(job: Doc, evt: Shown) -> bool:
    if isinstance(evt, WorkerStaging):
        return staging(job, evt)
    if isinstance(evt, EndpointReady):
        return endpoint_ready(job, evt)
    return endpoint_metered(job, evt)


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
    w.pop("staging", None)  # its progress is over
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
