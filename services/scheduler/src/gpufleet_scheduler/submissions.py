"""Submissions on their way to the store: a validated job and the future its submitter waits on.

On the leader a submission joins the next placement pass and is stored by its transaction
(commit.py); an instance that does not lead, or a pass that failed, stores it here alone.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from gpufleet_bus import emit
from gpufleet_contracts.jobs import JobQueued, JobSpec
from gpufleet_store import Doc, Transaction
from gpufleet_telemetry.instruments import METRICS

from .state import State

SUBMIT_BATCH = 500  # jobs per transaction when an instance that does not lead stores them


@dataclass
class Submission:
    """A validated job waiting to be stored. Its future is set once the job is in the store:
    True when the leader's pass that stored it also tried to place it, else False."""

    doc: Doc
    spec: JobSpec
    fut: asyncio.Future[bool]


def emit_queued(tx: Transaction, sub: Submission) -> None:
    d = sub.doc
    emit(
        tx,
        JobQueued(
            job_id=d["_id"],
            owner=d["owner"],
            creator=d["creator"],
            spec=sub.spec.redacted(),  # names only: values never travel in events
            queued_at=d["queued_at"],
            request_id=d.get("request_id"),
        ),
        trace=d.get("trace"),
    )


async def store_unplaced(st: State, batch: list[Submission]) -> None:
    """Store submissions without placing them (this instance does not lead, or the pass
    that took them failed): one transaction per SUBMIT_BATCH; errors go to the callers.

    A submission whose job is already stored (the same request id, stored by another
    instance that also heard it) is not stored again: its caller reads the stored job."""
    for i in range(0, len(batch), SUBMIT_BATCH):
        part = batch[i : i + SUBMIT_BATCH]
        stored: list[Submission] = []

        async def body(
            tx: Transaction, part: list[Submission] = part, stored: list[Submission] = stored
        ) -> int:
            rev = await st.next_rev(tx)  # first: a write (docs/nx-27017-gaps.md)
            ids = [s.doc["_id"] for s in part]
            there = st.db.jobs.find({"_id": {"$in": ids}}, {"_id": 1}, session=tx.session)
            known = {d["_id"] async for d in there}
            stored[:] = [s for s in part if s.doc["_id"] not in known]
            if not stored:
                return rev
            for s in stored:
                s.doc["rev"] = rev
                emit_queued(tx, s)
            await st.db.jobs.insert_many([s.doc for s in stored], session=tx.session)
            return rev

        try:
            rev = await st.store.transaction(body)
        except Exception as exc:
            for s in part:
                if not s.fut.done():
                    s.fut.set_exception(exc)
            continue
        if stored:
            METRICS.jobs_submitted.add(len(stored))
            await st.changed([s.doc for s in stored])
        st.committed(rev)
        for s in part:
            if not s.fut.done():
                s.fut.set_result(False)
