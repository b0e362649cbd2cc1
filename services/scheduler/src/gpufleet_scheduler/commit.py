"""What a placement pass writes: one fenced transaction per COMMIT_CHUNK jobs, holding the
placements of those jobs and the new jobs among them (placed or with their reason to wait),
each with its JobQueued. A job is written once, already placed or with its reason to wait.

A job whose secrets this key cannot open (the key changed), or that names an attached key
its creator no longer has (keyuse.py), fails when it is about to be placed, instead of
stopping the queue. The attached keys of the jobs being placed are read (opened) once per
transaction, before it.
"""

from __future__ import annotations

import logging
from datetime import datetime

from gpufleet_contracts.jobs import JobSpec, WorkerState
from gpufleet_store import Doc, SecretError, Transaction
from gpufleet_telemetry.instruments import METRICS
from pymongo import ReplaceOne

from . import jobdoc, keystore, keyuse, placing
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
    failing = _unreadable(st, by_job)
    opened = await _attached_keys(st, by_job, failing)

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
            if job_id in failing:
                job["rev"] = rev
                replaces.append(_fail_unreadable(st, tx, job, now, failing[job_id]))
                continue
            if items:
                spec = st.spec(job)
                secrets = keyuse.resolve(spec, opened.get(job["creator"], {}))
                for wt, p, s in items:
                    w = next(x for x in job["workers"] if x["index"] == wt.req.worker)
                    claims += placing.place_worker(tx, job, spec, w, p, s, now, epoch, secrets)
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


def _give_back(st: State, items: list[tuple[Waiting, Placement, Slots]]) -> None:
    for _, p, slots in items:
        st.fleet.release(p.node.node_id, [(g, sh) for _, g, sh in slots])


def _unreadable(st: State, by_job: Placed) -> dict[str, str]:
    """The jobs of a pass whose secrets this key cannot open, with that reason: their
    placements are given back (they fail instead, `_fail_unreadable`)."""
    out: dict[str, str] = {}
    for job_id, items in by_job.items():
        if not items:
            continue
        try:
            st.spec(st.jobs[job_id])
        except SecretError:
            out[job_id] = UNREADABLE
            _give_back(st, items)
    return out


async def _attached_keys(st: State, by_job: Placed, failing: dict[str, str]) -> keystore.Opened:
    """The opened keys of the creators of the jobs placed now that name keys (R-JOB-7); a
    job naming one its creator no longer has joins `failing`, its placements given back."""
    named: dict[str, JobSpec] = {}
    for j, items in by_job.items():
        spec = st.spec(st.jobs[j]) if items and j not in failing else None
        if spec is not None and spec.environment.keys:
            named[j] = spec
    if not named:
        return {}
    creators = {st.jobs[j]["creator"] for j in named}
    opened = await keystore.open_keys(st.store, st.box, creators)
    for j, spec in named.items():
        creator = st.jobs[j]["creator"]
        missing = keyuse.unattached(spec.environment.keys, opened.get(creator, {}), spec.env)
        if missing:
            failing[j] = keyuse.missing_reason(missing, creator)
            _give_back(st, by_job[j])
    return opened


def _fail_unreadable(
    st: State, tx: Transaction, job: Doc, now: datetime, reason: str = UNREADABLE
) -> ReplaceOne[Doc]:
    log.error("job %s: %s", job["_id"], reason)
    for w in job["workers"]:
        if w["state"] == WorkerState.waiting.value:
            w.update(state=WorkerState.failed.value, reason=reason, ended_at=now)
    job["queue_reason"] = None
    job["queue_detail"] = []
    return st.replace(tx, job, now, reason)
