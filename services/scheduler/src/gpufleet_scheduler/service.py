"""The scheduler's service layer: jobs, the queue and placement, on its own collections.

Every change is one transaction that also writes the events it causes to the outbox.
All changes go through one lock, so one scheduler process never races with itself; the
`claims` collection (one document per GPU, unique id) is what makes a GPU impossible to
give twice even if it did.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from decimal import Decimal
from typing import Any, cast

from gpufleet_bus import emit
from gpufleet_contracts.jobs import (
    JobQueued,
    JobSpec,
    JobState,
    JobStateChanged,
    StartWorker,
    StopWorker,
    WorkerFinished,
    WorkerPlaced,
    WorkerStarted,
    WorkerState,
)
from gpufleet_contracts.nodes import NodeRegistered, NodeStateChanged
from gpufleet_store import Store, Transaction
from pymongo import ASCENDING, IndexModel
from pymongo.errors import BulkWriteError, DuplicateKeyError

from .jobstate import job_state
from .placement import NodeView, NoPlacement, Placement, WorkerRequest, place

log = logging.getLogger("gpufleet.scheduler")

Doc = dict[str, Any]

INDEXES = {
    "jobs": [
        IndexModel([("state", ASCENDING), ("queued_at", ASCENDING)]),
        IndexModel([("owner", ASCENDING), ("queued_at", ASCENDING)]),
    ],
    "nodes": [IndexModel([("minion_id", ASCENDING)], unique=True)],
    "claims": [IndexModel([("placement_id", ASCENDING)])],
}

OPEN_STATES = [JobState.queued.value, JobState.starting.value, JobState.running.value]


class NotFound(Exception):
    pass


class Scheduler:
    def __init__(self, store: Store, clock: Callable[[], datetime]) -> None:
        self.store = store
        self.db = store.db
        self.clock = clock
        self.lock = asyncio.Lock()

    # --- commands -------------------------------------------------------------------

    async def submit(self, spec: JobSpec, account: str) -> Doc:
        now = self.clock()
        job_id = "j" + uuid.uuid4().hex[:12]
        doc: Doc = {
            "_id": job_id,
            "name": spec.name,
            "project": spec.project,
            "owner": account,  # a project is owned by the account that uses it (R-TEN-1)
            "creator": account,
            "spec": spec.model_dump(mode="json"),
            "state": JobState.queued.value,
            "history": [{"state": JobState.queued.value, "at": now, "reason": None}],
            "queue_reason": "not yet considered",
            "queued_at": now,
            "updated_at": now,
            "version": 0,
            "cancel_requested": False,
            "workers": [
                {"index": i, "state": WorkerState.waiting.value} for i in range(spec.workers)
            ],
        }

        async def body(tx: Transaction) -> None:
            await self.db.jobs.insert_one(doc, session=tx.session)
            emit(
                tx,
                JobQueued(job_id=job_id, owner=account, creator=account, spec=spec, queued_at=now),
            )
            emit(tx, JobStateChanged(job_id=job_id, state=JobState.queued, at=now))

        async with self.lock:
            await self.store.transaction(body)
        await self.schedule()
        return await self.get(job_id, account)

    async def cancel(self, job_id: str, account: str) -> Doc:
        async with self.lock:
            job = await self._job(job_id, account)
            if JobState(job["state"]).terminal:
                return self.view(job)
            now = self.clock()

            async def body(tx: Transaction) -> None:
                for w in job["workers"]:
                    if w["state"] == WorkerState.waiting.value:
                        w["state"] = WorkerState.stopped.value
                        w["reason"] = "cancelled while waiting"
                    elif w["state"] in (WorkerState.placed.value, WorkerState.running.value):
                        emit(
                            tx,
                            StopWorker(
                                minion_id=w["minion_id"],
                                job_id=job_id,
                                worker=w["index"],
                                placement_id=w["placement_id"],
                                reason="cancelled by user",
                            ),
                        )
                job["cancel_requested"] = True
                await self._save(tx, job, now, "cancelled by user")

            await self.store.transaction(body)
        return await self.get(job_id, account)

    # --- events ---------------------------------------------------------------------

    async def node_changed(self, evt: NodeRegistered | NodeStateChanged) -> None:
        async with self.lock:
            if isinstance(evt, NodeRegistered):
                models = {g.model for g in evt.gpus}
                await self.db.nodes.update_one(
                    {"_id": evt.node_id},
                    {
                        "$set": {
                            "minion_id": evt.minion_id,
                            "region": evt.region,
                            "owner": evt.owner,
                            "state": evt.state.value,
                            "name": evt.name,
                            "gpu_model": models.pop() if len(models) == 1 else None,
                            "gpu_indices": [g.index for g in evt.gpus],
                            "price_per_gpu_hour": None
                            if evt.price_per_gpu_hour is None
                            else str(evt.price_per_gpu_hour),
                            "allow_public_jobs": evt.allow_public_jobs,
                            "updated_at": evt.at,
                        }
                    },
                    upsert=True,
                )
            else:
                await self.db.nodes.update_one(
                    {"_id": evt.node_id}, {"$set": {"state": evt.state.value}}
                )
        await self.schedule()

    async def worker_started(self, evt: WorkerStarted) -> None:
        async with self.lock:
            job = await self.db.jobs.find_one({"_id": evt.job_id})
            w = self._worker(job, evt.worker, evt.placement_id)
            if job is None or w is None or w["state"] != WorkerState.placed.value:
                return  # unknown, superseded or already past this point: nothing to do
            w["state"] = WorkerState.running.value
            w["started_at"] = evt.started_at

            async def body(tx: Transaction) -> None:
                await self._save(tx, job, evt.started_at)

            await self.store.transaction(body)

    async def worker_finished(self, evt: WorkerFinished) -> None:
        async with self.lock:
            job = await self.db.jobs.find_one({"_id": evt.job_id})
            w = self._worker(job, evt.worker, evt.placement_id)
            if job is None or w is None or WorkerState(w["state"]).terminal:
                return
            if w["state"] == WorkerState.placed.value and evt.started_at is not None:
                # The finish overtook the start (separate consumers): record both, in order.
                w["state"] = WorkerState.running.value
                w["started_at"] = evt.started_at
                self._record_state(job, evt.started_at, None)
            w.update(
                state=evt.state.value,
                exit_code=evt.exit_code,
                reason=evt.reason,
                ended_at=evt.ended_at,
                started_at=w.get("started_at") or evt.started_at,
                log_tail=evt.log_tail[-4000:],
            )
            reason = evt.reason or (
                f"worker {evt.worker} exited with code {evt.exit_code}"
                if evt.state is WorkerState.failed
                else None
            )

            async def body(tx: Transaction) -> None:
                await self.db.claims.delete_many(
                    {"placement_id": evt.placement_id}, session=tx.session
                )
                await self._save(tx, job, evt.ended_at, reason)

            await self.store.transaction(body)
        await self.schedule()

    # --- the queue ------------------------------------------------------------------

    async def schedule(self) -> int:
        """One pass over the queue, oldest job first; a job that cannot start does not
        block younger ones that fit elsewhere (backfill). Returns workers placed."""
        placed = 0
        async with self.lock:
            nodes = await self._fleet()
            jobs = (
                await self.db.jobs.find({"state": {"$in": OPEN_STATES}})
                .sort("queued_at", ASCENDING)
                .to_list(None)
            )
            for job in jobs:
                waiting = [
                    w["index"] for w in job["workers"] if w["state"] == WorkerState.waiting.value
                ]
                if not waiting or job.get("cancel_requested"):
                    continue
                spec = JobSpec.model_validate(job["spec"])
                reason = None
                for index in waiting:
                    req = WorkerRequest(
                        job_id=job["_id"],
                        worker=index,
                        owner=job["owner"],
                        gpu_types=tuple(spec.gpu_types),
                        gpu_count=spec.gpu_count,
                        max_price=spec.max_price,
                    )
                    decision = place(req, list(nodes.values()))
                    if isinstance(decision, NoPlacement):
                        reason = decision.explain()
                        continue
                    if await self._commit_placement(job, index, spec, decision):
                        placed += 1
                        node = decision.node
                        nodes[node.node_id] = replace(
                            node,
                            free_indices=tuple(
                                i for i in node.free_indices if i not in decision.gpu_indices
                            ),
                        )
                    # Re-read: the commit (or the race that beat it) changed the job.
                    job = await self.db.jobs.find_one({"_id": job["_id"]}) or job
                if reason != job.get("queue_reason"):
                    await self.db.jobs.update_one(
                        {"_id": job["_id"], "version": job["version"]},
                        {"$set": {"queue_reason": reason}},
                    )
        return placed

    async def _commit_placement(self, job: Doc, index: int, spec: JobSpec, d: Placement) -> bool:
        now = self.clock()
        w = next(w for w in job["workers"] if w["index"] == index)
        placement_id = uuid.uuid4().hex
        node: NodeView = d.node

        async def body(tx: Transaction) -> None:
            await self.db.claims.insert_many(
                [
                    {
                        "_id": f"{node.node_id}:{i}",
                        "node_id": node.node_id,
                        "gpu_index": i,
                        "job_id": job["_id"],
                        "worker": w["index"],
                        "placement_id": placement_id,
                    }
                    for i in d.gpu_indices
                ],
                session=tx.session,
            )
            w.update(
                state=WorkerState.placed.value,
                placement_id=placement_id,
                node_id=node.node_id,
                minion_id=node.minion_id,
                region=node.region,
                gpu_model=node.gpu_model,
                gpu_indices=list(d.gpu_indices),
                rate=str(d.rate),
                charge=d.charge,
                placed_at=now,
            )
            job["queue_reason"] = None
            await self._save(tx, job, now)
            emit(
                tx,
                WorkerPlaced(
                    job_id=job["_id"],
                    worker=w["index"],
                    placement_id=placement_id,
                    node_id=node.node_id,
                    minion_id=node.minion_id,
                    region=node.region,
                    gpu_model=node.gpu_model or "",
                    gpu_indices=list(d.gpu_indices),
                    gpu_count=len(d.gpu_indices),
                    rate=d.rate,
                    charge=d.charge,
                    payer=job["owner"],
                    node_owner=node.owner,
                    placed_at=now,
                    creator=job["creator"],
                    job_type=spec.type,
                ),
            )
            emit(
                tx,
                StartWorker(
                    minion_id=node.minion_id,
                    job_id=job["_id"],
                    job_name=job["name"],
                    worker=w["index"],
                    command=spec.command,
                    env=spec.env,
                    gpu_indices=list(d.gpu_indices),
                    placement_id=placement_id,
                ),
            )

        try:
            await self.store.transaction(body)
        except (DuplicateKeyError, BulkWriteError, StaleJob) as exc:
            log.warning("placement of %s/%s lost a race: %s", job["_id"], w["index"], exc)
            return False
        return True

    # --- queries --------------------------------------------------------------------

    async def get(self, job_id: str, account: str) -> Doc:
        return self.view(await self._job(job_id, account))

    async def list(self, account: str, limit: int = 100) -> list[Doc]:
        jobs = await self.db.jobs.find({"owner": account}).sort("queued_at", -1).to_list(limit)
        return [self.view(j) for j in jobs]

    @staticmethod
    def view(job: Doc) -> Doc:
        rates = {w.get("rate") for w in job["workers"] if w.get("rate")}
        return {
            "id": job["_id"],
            "name": job["name"],
            "project": job["project"],
            "owner": job["owner"],
            "creator": job["creator"],
            "state": job["state"],
            "queue_reason": job.get("queue_reason"),
            "rate": rates.pop() if len(rates) == 1 else (sorted(rates) or None),
            "spec": job["spec"],
            "history": [
                {"state": h["state"], "at": h["at"].isoformat(), "reason": h.get("reason")}
                for h in job["history"]
            ],
            "workers": [
                {
                    "index": w["index"],
                    "state": w["state"],
                    "node": w.get("minion_id"),
                    "node_id": w.get("node_id"),
                    "region": w.get("region"),
                    "gpu_model": w.get("gpu_model"),
                    "gpu_indices": w.get("gpu_indices"),
                    "rate": w.get("rate"),
                    "charge": w.get("charge"),
                    "started_at": _iso(w.get("started_at")),
                    "ended_at": _iso(w.get("ended_at")),
                    "run_seconds": _seconds(w.get("started_at"), w.get("ended_at")),
                    "exit_code": w.get("exit_code"),
                    "reason": w.get("reason"),
                    "log_tail": w.get("log_tail", ""),
                }
                for w in job["workers"]
            ],
            "queued_at": job["queued_at"].isoformat(),
        }

    # --- helpers --------------------------------------------------------------------

    async def _job(self, job_id: str, account: str) -> Doc:
        job = await self.db.jobs.find_one({"_id": job_id, "owner": account})
        if job is None:  # another account's job answers "not found" too (R-TEN-2)
            raise NotFound(f"job {job_id} not found")
        return job

    @staticmethod
    def _worker(job: Doc | None, index: int, placement_id: str) -> Doc | None:
        if job is None:
            return None
        for w in job["workers"]:
            if w["index"] == index and w.get("placement_id") == placement_id:
                return cast(Doc, w)
        return None

    def _record_state(self, job: Doc, at: datetime, reason: str | None) -> JobState | None:
        """Recompute the job's state from its workers; append to history if it changed."""
        new = job_state(
            (WorkerState(w["state"]) for w in job["workers"]), job.get("cancel_requested", False)
        )
        if new.value == job["state"]:
            return None
        previous = job["state"]
        job["state"] = new.value
        job["history"].append({"state": new.value, "at": at, "reason": reason})
        return JobState(previous)

    async def _save(
        self, tx: Transaction, job: Doc, at: datetime, reason: str | None = None
    ) -> None:
        previous = self._record_state(job, at, reason)
        if previous is not None:
            emit(
                tx,
                JobStateChanged(
                    job_id=job["_id"],
                    state=JobState(job["state"]),
                    previous=previous,
                    reason=reason,
                    at=at,
                ),
            )
        version = job["version"]
        job["version"] = version + 1
        job["updated_at"] = self.clock()
        res = await self.db.jobs.replace_one(
            {"_id": job["_id"], "version": version}, job, session=tx.session
        )
        if res.matched_count != 1:
            job["version"] = version
            raise StaleJob(job["_id"])

    async def _fleet(self) -> dict[str, NodeView]:
        claimed: dict[str, set[int]] = {}
        async for c in self.db.claims.find({}):
            claimed.setdefault(c["node_id"], set()).add(c["gpu_index"])
        nodes = {}
        async for n in self.db.nodes.find({}):
            indices = tuple(n.get("gpu_indices", []))
            nodes[n["_id"]] = NodeView(
                node_id=n["_id"],
                minion_id=n["minion_id"],
                region=n["region"],
                owner=n["owner"],
                state=n["state"],
                gpu_model=n.get("gpu_model"),
                gpu_indices=indices,
                free_indices=tuple(i for i in indices if i not in claimed.get(n["_id"], set())),
                price_per_gpu_hour=Decimal(n["price_per_gpu_hour"])
                if n.get("price_per_gpu_hour")
                else None,
                allow_public_jobs=bool(n.get("allow_public_jobs")),
            )
        return nodes


class StaleJob(Exception):
    """The job changed under us (optimistic concurrency); the caller retries or skips."""


def _iso(v: datetime | None) -> str | None:
    return v.isoformat() if v else None


def _seconds(a: datetime | None, b: datetime | None) -> float | None:
    return round((b - a).total_seconds(), 3) if a and b else None
