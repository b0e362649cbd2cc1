"""What a placement pass writes: one fenced transaction per COMMIT_CHUNK jobs, holding the
placements of those jobs and the new jobs among them (placed or with their reason to wait),
each with its JobQueued. A job is written once, already placed or with its reason to wait.

A job whose secrets this key cannot open (the key changed) fails when it is about to be
placed, instead of stopping the queue.
"""

from __future__ import annotations

import logging
from datetime import datetime

from gpufleet_contracts.jobs import WorkerState
from gpufleet_store import Doc, SecretError, Transaction
from gpufleet_telemetry.instruments import METRICS
from pymongo import ReplaceOne

from . import jobdoc, placing
from .placement import Placement
from .queue import Waiting
from .state import StaleJob, State
from .submissions import Submission, emit_queued

log = logging.getLogger("gpufleet.scheduler")

Slots = list[tuple[str, int, int]]  # (claim id, GPU, share)
Placed = dict[str, list[tuple[Waiting, Placement, Slots]]]  # job id -> its placed workers
UNREADABLE = "its secrets (env values) do not decrypt with the scheduler's GPUFLEET_SECRET_KEY"


async def commit(st: State, by_job: Placed, fresh: dict[str, Submission], now: datetime) -> None:
    """One fenced transaction: the placements of these jobs, and the jobs of `fresh`
    among them inserted (placed or with their reason to wait) with their JobQueued."""
    docs: dict[str, Doc] = {}
    partial = [j for j in by_job if st.jobs[j].get("partial")]
    if partial:  # known from a checkpoint: the whole document is needed now
        for full in await st.db.jobs.find({"_id": {"$in": partial}}).to_list(None):
            st.jobs[full["_id"]] = full
    unreadable = _unreadable(st, by_job)

    async def body(tx: Transaction) -> int:
        docs.clear()
        docs.update({j: jobdoc.copy_job(st.jobs[j]) for j in by_job})
        epoch = await st.lease.fence(tx.session)
        rev = await st.next_rev(tx)
        claims: list[Doc] = []
        inserts: list[Doc] = []
        replaces: list[ReplaceOne[Doc]] = []
        for job_id, items in by_job.items():
            job = docs[job_id]
            sub = fresh.get(job_id)
            if sub is not None:
                emit_queued(tx, sub)
            if job_id in unreadable:
                job["rev"] = rev
                replaces.append(_fail_unreadable(st, tx, job, now))
                continue
            if items:
                spec = st.spec(job)
                for wt, p, s in items:
                    w = next(x for x in job["workers"] if x["index"] == wt.req.worker)
                    claims += placing.place_worker(tx, job, spec, w, p, s, now, epoch)
                job["queue_reason"] = None
                job["queue_detail"] = []
            job["rev"] = rev
            if sub is None:
                replaces.append(st.replace(tx, job, now))
            else:
                if items:
                    st.bump(tx, job, now, None)
                inserts.append(job)
        if claims:
            await st.db.claims.insert_many(claims, session=tx.session)
        if inserts:
            await st.db.jobs.insert_many(inserts, session=tx.session)
        if replaces:
            res = await st.db.jobs.bulk_write(replaces, ordered=False, session=tx.session)
            if res.matched_count != len(replaces):
                raise StaleJob(f"{len(replaces) - res.matched_count} jobs changed")
        return rev

    rev = await st.store.transaction(body)
    for job in docs.values():
        st.cache(job)
    st.committed(rev)
    stored = [fresh[j] for j in by_job if j in fresh]
    if stored:
        METRICS.jobs_submitted.add(len(stored))
    for sub in stored:
        if not sub.fut.done():
            sub.fut.set_result(True)


def _unreadable(st: State, by_job: Placed) -> set[str]:
    """The jobs of a pass whose secrets this key cannot open: their placements are given
    back (they fail instead, `_fail_unreadable`)."""
    out: set[str] = set()
    for job_id, items in by_job.items():
        if not items:
            continue
        try:
            st.spec(st.jobs[job_id])
        except SecretError:
            out.add(job_id)
            for _, p, slots in items:
                st.fleet.release(p.node.node_id, [(g, sh) for _, g, sh in slots])
    return out


def _fail_unreadable(st: State, tx: Transaction, job: Doc, now: datetime) -> ReplaceOne[Doc]:
    log.error("job %s: its secrets do not decrypt with GPUFLEET_SECRET_KEY", job["_id"])
    for w in job["workers"]:
        if w["state"] == WorkerState.waiting.value:
            w.update(state=WorkerState.failed.value, reason=UNREADABLE, ended_at=now)
    job["queue_reason"] = None
    job["queue_detail"] = []
    return st.replace(tx, job, now, UNREADABLE)
