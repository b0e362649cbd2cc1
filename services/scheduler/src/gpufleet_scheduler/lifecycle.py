"""The lifecycle of nodes and jobs: nodes registered, verified or not, changing state or
lost (their workers requeued); jobs cancelled. Workers started and finished are reports.py's.

A requeued worker's old placement is void: its node is told to stop it (StopWorker, kept in
the node's command stream until it reads it, so a node that comes back stops it before it
runs anything newer), its run is closed at the loss (the scheduler's own WorkerFinished
`failed`, on the node's `kept` subject: billing charges up to there and no further), and a
later report of it, from a node that was not dead after all, changes nothing here or in
billing (its placement id is no longer the worker's). Between the requeue and the
StopWorker reaching a live node the old run may overlap a new one briefly; that overlap is
never charged.
"""

from __future__ import annotations

import contextlib
from datetime import datetime

from gpufleet_bus import emit
from gpufleet_contracts import subjects
from gpufleet_contracts.jobs import (
    JobState,
    JobType,
    StopWorker,
    WorkerFinished,
    WorkerState,
)
from gpufleet_contracts.nodes import NodeRegistered, NodeStateChanged
from gpufleet_contracts.verification import NodeVerified
from gpufleet_store import Doc, Transaction, now_ms

from . import environments, jobdoc, sealing, tenancy
from .fleet import node_view
from .passes import Passes
from .state import HOLDING, OPEN_STATES, State

MAX_REQUEUES = 3  # a worker whose node is lost this many times fails instead
ACCOUNT_REMOVED = "account removed"  # the reason of a removed account's jobs' ends


class Lifecycle:
    def __init__(self, state: State, passes: Passes) -> None:
        self.state = state
        self.passes = passes

    # --- jobs -------------------------------------------------------------------------

    async def cancel(self, job_id: str, account: str) -> Doc:
        """Cancel a job (its owner or its creator): waiting workers stop, placed ones are
        told to; returns its view."""
        st = self.state
        async with st.lock:
            job = await st.find_job(job_id, account)
            if JobState(job["state"]).terminal:
                return jobdoc.view(job)
            now = st.clock()

            async def body(tx: Transaction) -> None:
                await self._cancel(tx, job, now, "cancelled while waiting", "cancelled by user")

            await st.store.transaction(body)
            await st.changed([job])
            st.committed(job["rev"])
        self.passes.request_pass()
        return jobdoc.view(await st.find_job(job_id, account))

    async def account_removed(self, account: str) -> int:
        """The provisioner removed `account`: every open job it owns or created is cancelled
        as `cancel` cancels one (its waiting workers stop, its placed ones are told to), one
        transaction each; how many. A job already cancelled is left alone, so a redelivery
        changes nothing."""
        st = self.state
        cancelled = 0
        async with st.lock:
            now = st.clock()
            query = {**tenancy.visible_to(account), "state": {"$in": OPEN_STATES}}
            for job in await st.db.jobs.find(query).to_list(None):
                if job.get("cancel_requested"):
                    continue

                async def body(tx: Transaction, job: Doc = job) -> None:
                    await self._cancel(tx, job, now, ACCOUNT_REMOVED, ACCOUNT_REMOVED)

                await st.store.transaction(body)
                await st.changed([job])
                st.committed(job["rev"])
                cancelled += 1
        if cancelled:
            self.passes.request_pass()
        return cancelled

    async def _cancel(
        self, tx: Transaction, job: Doc, now: datetime, waiting: str, reason: str
    ) -> None:
        """The open job `job` cancelled in `tx`: its waiting workers stopped (`waiting`),
        its placed ones told to stop (`reason`), the job saved with `reason`."""
        for w in job["workers"]:
            if w["state"] == WorkerState.waiting.value:
                w["state"] = WorkerState.stopped.value
                w["reason"] = waiting
            elif w["state"] in HOLDING:
                emit(tx, stop(job, w, reason), trace=job.get("trace"))
        job["cancel_requested"] = True
        await self.state.save(tx, job, now, reason)

    # --- nodes ------------------------------------------------------------------------

    async def node_changed(self, evt: NodeRegistered | NodeStateChanged) -> None:
        st = self.state
        async with st.lock:
            if isinstance(evt, NodeRegistered):
                fields = await self._write_registered(evt.node_id, _node_fields(evt))
                if st.loaded:
                    st.fleet.upsert(node_view({"_id": evt.node_id, **fields}))
            else:
                await self._write_node(
                    evt.node_id, {"state": evt.state.value, "updated_ms": now_ms(evt.at)}
                )
                if st.loaded:
                    st.fleet.set_state(evt.node_id, evt.state.value)
                if evt.state.value in ("lost", "removed"):
                    await self._node_gone(evt)
            if not st.loaded and st.notify is not None:
                with contextlib.suppress(Exception):
                    await st.notify([], [evt.node_id])
        await self.passes.request_pass()

    async def node_verified(self, evt: NodeVerified) -> None:
        """The provisioner's verdict on a node's hardware (verified: it may take other
        accounts' jobs). One older than what the node holds (by `verification_rev`: its
        registrations come on another consumer) changes nothing; one for a node not
        registered here yet waits for it (NodeNotRegistered: redelivered later)."""
        st = self.state
        async with st.lock:

            async def body(tx: Transaction) -> tuple[int, bool]:
                rev = await st.next_rev(tx)
                stored = await st.db.nodes.find_one({"_id": evt.node_id}, session=tx.session)
                if stored is None:
                    raise NodeNotRegistered(evt.node_id)
                if int(stored.get("verification_rev") or 0) > evt.verification_rev:
                    return rev, False
                await st.db.nodes.update_one(
                    {"_id": evt.node_id},
                    {
                        "$set": {
                            "verified": evt.verified,
                            "verification_rev": evt.verification_rev,
                            "rev": rev,
                        }
                    },
                    session=tx.session,
                )
                return rev, True

            rev, applied = await st.store.transaction(body)
            st.committed(rev)
            if applied and st.loaded:
                st.fleet.set_verified(evt.node_id, evt.verified)
            if applied and not st.loaded and st.notify is not None:
                with contextlib.suppress(Exception):
                    await st.notify([], [evt.node_id])
        if applied:
            await self.passes.request_pass()

    async def _write_registered(self, node_id: str, fields: Doc) -> Doc:
        """A registration's fields written; the node keeps the verification it holds when
        that is newer (a NodeVerified read before this NodeRegistered). What was written."""
        st = self.state

        async def body(tx: Transaction) -> tuple[int, Doc]:
            rev = await st.next_rev(tx)
            stored = await st.db.nodes.find_one({"_id": node_id}, session=tx.session)
            out = dict(fields)
            held = int((stored or {}).get("verification_rev") or 0)
            if stored is not None and held > int(fields["verification_rev"]):
                out.update(verified=bool(stored.get("verified")), verification_rev=held)
            await st.db.nodes.update_one(
                {"_id": node_id}, {"$set": {**out, "rev": rev}}, upsert=True, session=tx.session
            )
            return rev, out

        rev, out = await st.store.transaction(body)
        st.committed(rev)
        return out

    async def _write_node(self, node_id: str, fields: Doc, upsert: bool = False) -> None:
        st = self.state

        async def body(tx: Transaction) -> int:
            rev = await st.next_rev(tx)
            await st.db.nodes.update_one(
                {"_id": node_id},
                {"$set": {**fields, "rev": rev}},
                upsert=upsert,
                session=tx.session,
            )
            return rev

        st.committed(await st.store.transaction(body))

    async def _node_gone(self, evt: NodeStateChanged) -> None:
        """A lost (or removed) node's workers: requeued, or failed for notebooks.

        Training, inference and endpoint workers go back to waiting (a new placement later,
        from their checkpoints); a notebook's interactive state is gone with its node, so
        it fails. A worker lost MAX_REQUEUES times fails too. Its claims are released, the
        run is closed (WorkerFinished `failed`, "node lost": billing stops counting), the
        job's notes record it, and a StopWorker goes to the node in case it comes back.
        """
        st = self.state
        jobs = await st.db.jobs.find(
            {"state": {"$in": OPEN_STATES}, "workers.node_id": evt.node_id}
        ).to_list(None)
        changed: list[Doc] = []
        for job in jobs:
            hit = [
                w
                for w in job["workers"]
                if w.get("node_id") == evt.node_id and w["state"] in HOLDING
            ]
            if hit:
                await self._lose_workers(job, hit, evt)
                changed.append(job)
        if st.loaded:
            st.fleet.clear_claims(evt.node_id)
        await st.changed(changed, [evt.node_id])

    async def _lose_workers(self, job: Doc, hit: list[Doc], evt: NodeStateChanged) -> None:
        st = self.state
        job_type = st.request(job).type
        now = st.clock()
        reason = f"node {evt.minion_id} {evt.state.value}"

        async def body(tx: Transaction) -> None:
            for w in hit:
                emit(tx, stop(job, w, reason), trace=job.get("trace"))
                started = w.get("started_at")
                emit(
                    tx,
                    WorkerFinished(
                        job_id=job["_id"],
                        worker=w["index"],
                        placement_id=w["placement_id"],
                        minion_id=w["minion_id"],
                        state=WorkerState.failed,
                        reason=reason,
                        started_at=started if isinstance(started, datetime) else None,
                        ended_at=now,
                    ),
                    subject=subjects.kept("finished", w["minion_id"]),
                    trace=job.get("trace"),
                )
                await st.db.claims.delete_many(
                    {"placement_id": w["placement_id"]}, session=tx.session
                )
                attempts = [*w.get("attempts", []), jobdoc.attempt(w, reason, now)]
                requeue = job_type is not JobType.notebook and len(attempts) <= MAX_REQUEUES
                for k in jobdoc.PLACEMENT_KEYS:
                    w.pop(k, None)
                w["attempts"] = attempts
                if requeue:
                    w["state"] = WorkerState.waiting.value
                    note = f"worker {w['index']} requeued: {reason}"
                else:
                    w.update(state=WorkerState.failed.value, reason=reason, ended_at=now)
                    note = f"worker {w['index']} failed: {reason}" + (
                        " (notebooks are not restarted)"
                        if job_type is JobType.notebook
                        else f" ({MAX_REQUEUES} requeues used)"
                    )
                job.setdefault("notes", []).append({"at": now, "note": note})
            await st.save(tx, job, now, reason)

        await st.store.transaction(body)


def stop(job: Doc, w: Doc, reason: str) -> StopWorker:
    return StopWorker(
        minion_id=w["minion_id"],
        job_id=job["_id"],
        worker=w["index"],
        placement_id=w["placement_id"],
        reason=reason,
    )


def _node_fields(evt: NodeRegistered) -> Doc:
    """A registered node's document (fleet.node_view reads it)."""
    models = {g.model for g in evt.gpus}
    mems = [g.memory_mb for g in evt.gpus]
    return {
        "minion_id": evt.minion_id,
        "region": evt.region,
        "owner": evt.owner,
        "state": evt.state.value,
        "name": evt.name,
        "gpu_model": models.pop() if len(models) == 1 else None,
        "gpu_indices": [g.index for g in evt.gpus],
        "gpu_memory_mb": min(mems) if mems else None,
        "gpu_shares": evt.gpu_shares,
        "price_per_gpu_hour": None
        if evt.price_per_gpu_hour is None
        else str(evt.price_per_gpu_hour),
        "allow_public_jobs": evt.allow_public_jobs,
        "simulated": evt.simulated,
        "cpu_count": evt.cpu_count,  # logical CPUs, as reported
        "cpus": evt.cpu_job_cpus,  # offered to CPU-only jobs (R-JOB-2)
        "price_per_cpu_hour": None
        if evt.price_per_cpu_hour is None
        else str(evt.price_per_cpu_hour),
        # what its workers' secrets are sealed to (sealing.py); None: it takes none
        "sealing_key": sealing.accepted(evt.sealing_key),
        # the base environments it runs (R-JOB-7); None: its agent announced none
        "environments": environments.stored(evt.environments),
        # where its proxy serves endpoints (a URL template); None: it serves none
        "proxy_url": evt.proxy_url,
        # the provisioner's verdict on its hardware, as of this registration
        "verified": evt.verified,
        "verification_rev": evt.verification_rev,
        "updated_ms": now_ms(evt.at),
    }


class NodeNotRegistered(Exception):
    """A node's verdict read before its registration (another consumer): handled again
    later, once the registration is (the bus redelivers it)."""
