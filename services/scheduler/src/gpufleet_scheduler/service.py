"""The scheduler's service layer: jobs, the queue and placement, on its own collections.

State lives in the database; the leading instance (leadership.py) also keeps the open jobs
and the fleet in memory (`fleet.py`, indexed for placement) and rebuilds them from the
store when it starts or takes the lead. Every change is one transaction that also writes
the events it causes to the outbox. On the leader, new submissions join the next placement
pass and are stored by its transactions (fenced by the lease, up to COMMIT_CHUNK jobs each):
a job is written once, already placed or with its reason to wait.

Beside it: the job documents (jobdoc.py), what placing a worker writes (placing.py), the
pass's decisions (queue.py, placement.py, index.py: pure), memory kept out of the garbage
collector's way (heap.py) and the checkpoints a restart loads (checkpoint.py).

Any instance answers requests and handles events (writing to the store); an instance that
does not lead tells the leader which jobs and nodes changed (`sync`), so the leader's
memory follows; a periodic reload bounds the staleness should such a note be lost.

Transactions on one database run one at a time in a process (`Store.transaction`): nx-27017 cannot
interleave two transactions at all ("no such savepoint", and the failed one may be left
half-applied), even from one client. Two scheduler *processes* against nx-27017 can still
collide; run one scheduler process with nx-27017 (as `just up` does). MongoDB has no such
limit, and there the lease's fencing is what keeps a second instance harmless.

Secrets (a job's env values, R-JOB-7) are sealed with the scheduler's key (settings
`secret_key`, GPUFLEET_SECRET_KEY) wherever they are stored: the job document (jobdoc.py) and
the outbox row of the worker's StartWorker (`emit(sealed=True)`). JobQueued and every reply
carry the env names with "<secret>" values. A job whose secrets this key cannot open (the key
changed) fails when it is about to be placed, instead of stopping the queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

from gpufleet_bus import emit
from gpufleet_contracts import ErrorBody, ErrorReply, FieldError
from gpufleet_contracts.jobs import (
    Demand,
    JobQueued,
    JobSpec,
    JobState,
    JobStateChanged,
    JobType,
    PendingDemandChanged,
    StopWorker,
    WorkerFinished,
    WorkerStarted,
    WorkerState,
)
from gpufleet_contracts.nodes import NodeRegistered, NodeStateChanged
from gpufleet_store import SecretBox, SecretError, Store, Transaction, from_ms, now_ms
from gpufleet_telemetry.instruments import METRICS
from pymongo import ASCENDING, IndexModel, ReplaceOne, UpdateOne
from pymongo.errors import BulkWriteError, DuplicateKeyError, OperationFailure

from . import checkpoint, jobdoc, placing, projects, tenancy
from .errors import NotFound as NotFound  # re-exported: callers import them from here
from .errors import Refused
from .fleet import Fleet, node_doc, node_view
from .heap import Heap, collector_paused
from .leadership import Deposed, Lease
from .placement import NoPlacement, Placement, WorkerRequest
from .queue import PassResult, Waiting, plan

log = logging.getLogger("gpufleet.scheduler")
Doc = dict[str, Any]

INDEXES = {
    "jobs": [
        IndexModel([("state", ASCENDING), ("queued_at", ASCENDING)]),
        IndexModel([("owner", ASCENDING), ("queued_at", ASCENDING)]),
        IndexModel([("creator", ASCENDING), ("queued_at", ASCENDING)]),  # federated jobs
        IndexModel([("rev", ASCENDING)]),  # what changed after a checkpoint
    ],
    "nodes": [
        IndexModel([("minion_id", ASCENDING)], unique=True),
        IndexModel([("rev", ASCENDING)]),
    ],
    "claims": [
        IndexModel([("placement_id", ASCENDING)]),
        IndexModel([("node_id", ASCENDING)]),
    ],
    **projects.INDEXES,
}

OPEN_STATES = [JobState.queued.value, JobState.starting.value, JobState.running.value]
HOLDING = (WorkerState.placed.value, WorkerState.running.value)
MAX_REQUEUES = 3  # a worker whose node is lost this many times fails instead
SUBMIT_BATCH = 500  # jobs per transaction when an instance that does not lead stores them
ADMIT_MAX = 4096  # submissions taken into one placement pass
COMMIT_CHUNK = 500  # jobs per placement transaction
CHECKPOINT_AFTER = 10_000  # documents changed at once that call for a checkpoint now
UNREADABLE = "its secrets (env values) do not decrypt with the scheduler's GPUFLEET_SECRET_KEY"


@dataclass(frozen=True)
class SchedulerSettings:
    starve_after_s: float = 300.0  # anti-starvation: a worker older than this holds a node
    max_holds: int = 16
    explain_budget: int = 32  # request shapes explained per pass (queue.py)
    resync_s: float = 30.0  # the leader reads what changed this often (bounds staleness)
    checkpoint_s: float = 60.0  # the leader writes its memory this often (checkpoint.py)
    # Fernet key sealing job secrets at rest (GPUFLEET_SECRET_KEY). None: a key made for
    # this process (in-process tests; `python -m gpufleet_scheduler` refuses to run without
    # one unless GPUFLEET_EPHEMERAL_SECRET_KEY=1).
    secret_key: str | None = field(default=None, repr=False)

    def box(self) -> SecretBox:
        if self.secret_key:
            return SecretBox(self.secret_key)
        log.warning(
            "no GPUFLEET_SECRET_KEY: job secrets are sealed with a key of this process, "
            "which another process or a restart cannot open"
        )
        return SecretBox.for_process()


class StaleJob(Exception):
    """The job changed under us (optimistic concurrency); the caller reloads and retries."""


@dataclass
class Submission:
    """A validated job waiting to be stored. Its future is set once the job is in the store:
    True when the leader's pass that stored it also tried to place it, else False."""

    doc: Doc
    spec: JobSpec
    fut: asyncio.Future[bool]


class Scheduler:
    def __init__(
        self,
        store: Store,
        clock: Callable[[], datetime],
        *,
        lease: Lease | None = None,
        settings: SchedulerSettings | None = None,
        notify: Callable[[list[str], list[str]], Awaitable[None]] | None = None,
    ) -> None:
        self.store = store
        self.db = store.db
        self.clock = clock
        self.lease = lease or Lease(store.db)
        self.settings = settings or SchedulerSettings()
        self.box = self.settings.box()
        store.box = self.box  # the outbox seals the StartWorker that carries a job's env
        self.notify = notify  # tells the leader what changed (set by the app)
        self.lock = asyncio.Lock()
        self.fleet = Fleet()
        self.jobs: dict[str, Doc] = {}  # open jobs, while leading
        # The waiting workers of each job that has some, kept current by `_track` whenever a
        # job enters memory: a pass reads them instead of walking every open job.
        self.unplaced: dict[str, list[Waiting]] = {}
        self.specs: dict[str, JobSpec] = {}
        self.loaded = False
        self.holds: dict[str, str] = {}
        self.last_pass: PassResult | None = None
        self._demand: frozenset[tuple[str, int, str | None]] = frozenset()
        self._submits: list[Submission] = []
        self._pending: dict[str, asyncio.Future[bool]] = {}  # job id -> its submission
        self._pass_waiters: list[asyncio.Future[int]] = []
        self._passer: asyncio.Task[None] | None = None
        self._loaded_at = 0.0
        self.rev = 0  # memory holds every change up to this revision (checkpoint.py)
        self.loaded_from = ""  # "documents" or "checkpoint at rev N"
        self.checkpointed_rev = 0
        self._loaded_epoch: int | None = None
        self._first_pass = False  # the next pass is the first since loading (logged)
        self._checkpointing: asyncio.Task[None] | None = None
        self._explained: dict[tuple[object, ...], int] = {}  # shape -> pass that explained it
        self._passes = 0
        self._explain_more = False  # shapes wait for a first explanation: pass again soon
        self.heap = Heap()  # freezes long-lived memory after loads and passes (heap.py)
        self.projects = projects.Projects(store)  # projects and plans (R-TEN-1, R-TEN-3)

    # --- leadership and memory ---------------------------------------------------------

    async def lead(self) -> bool:
        """Take or renew the lease; (re)build memory when newly leading."""
        if self.loaded and self.lease.fresh():
            return True  # renewed recently; every placement is fenced anyway
        held = await self.lease.acquire()
        # Memory stays valid while the epoch is ours: a lease that lapsed during a long
        # pass and was renewed by us (same epoch) means no other leader came between.
        if held and not (self.loaded and self.lease.epoch == self._loaded_epoch):
            await self.load()
            self._loaded_epoch = self.lease.epoch
        if not held and self.loaded:
            self.loaded = False
            self.jobs.clear()
            self.specs.clear()
            self.unplaced.clear()
        return held

    async def load(self) -> None:
        """Rebuild the fleet and the open jobs (start, new leader, lost race): from the
        latest checkpoint and what changed after it, or from every document if none.

        The cyclic garbage collector is paused meanwhile and what was loaded is frozen
        after (heap.py): building ~10^6 containers otherwise triggers a collection every
        700 allocations, full ones walking everything loaded so far (the checkpoint's decode
        alone took 3.8 s instead of 1.6 s at 100,000 jobs)."""
        with collector_paused():
            await self._load()
            # Frozen before the collector runs again: else its next young collection walks
            # everything built meanwhile (never collected, all of it "young").
            self.heap.settle()

    async def _load(self) -> None:
        t0 = asyncio.get_running_loop().time()
        cp = await checkpoint.read(self.db)
        rev = await checkpoint.current_rev(self.db)  # before the reads (checkpoint.py)
        self.specs = {}
        if cp is None:
            nodes = await self.db.nodes.find({}).to_list(None)
            jobs = await self.db.jobs.find({"state": {"$in": OPEN_STATES}}).to_list(None)
            self.jobs = {j["_id"]: j for j in jobs}
            read, source = len(nodes) + len(jobs), "documents"
        else:
            self.checkpointed_rev = cp.rev
            self.jobs = {j["_id"]: j for j in cp.jobs}
            later = {"rev": {"$gt": cp.rev}}
            nodes = cp.nodes + await self.db.nodes.find(later).to_list(None)
            changed = await self.db.jobs.find(later).to_list(None)
            for j in changed:
                self._cache(j)
            read, source = len(changed), f"checkpoint at rev {cp.rev}"
        self.unplaced = {}
        for job in self.jobs.values():
            self._track(job)
        self._explained = {}  # reasons loaded are explained again, a budget per pass
        nodes_by_id = {n["_id"]: n for n in nodes}  # a later document replaces its entry
        self.fleet.load(list(nodes_by_id.values()), self._claims())
        self.rev = rev
        self.loaded = True
        self._first_pass = True
        self.loaded_from = source
        self._loaded_at = asyncio.get_running_loop().time()
        log.info(
            "loaded %d nodes, %d open jobs from %s and %d documents in %.2f s (rev %d)",
            len(nodes_by_id),
            len(self.jobs),
            source,
            read,
            self._loaded_at - t0,
            rev,
        )
        if read > CHECKPOINT_AFTER:  # the next start should not read them again
            self.checkpoint_soon()

    def _claims(self) -> list[Doc]:
        """What the open jobs hold, as claims (the `claims` collection holds the same)."""
        out: list[Doc] = []
        for job in self.jobs.values():
            for w in job["workers"]:
                if w["state"] not in HOLDING or not w.get("node_id"):
                    continue
                out += [
                    {"node_id": w["node_id"], "gpu_index": g, "share": sh}
                    for g, sh in jobdoc.held_slots(w)
                ]
        return out

    async def catch_up(self) -> int:
        """Read what changed after `self.rev` (other instances' writes; a lost note)."""
        rev = await checkpoint.current_rev(self.db)
        nodes = await self.db.nodes.find({"rev": {"$gt": self.rev}}).to_list(None)
        jobs = await self.db.jobs.find({"rev": {"$gt": self.rev}}).to_list(None)
        for n in nodes:
            self.fleet.upsert(node_view(n))
        for j in jobs:
            mine = self.jobs.get(j["_id"])
            if mine is None or int(mine.get("version", 0)) <= int(j.get("version", 0)):
                self._cache(j)
        if jobs:  # claims follow the jobs
            self.fleet.set_claims(self._claims())
        self.rev = max(self.rev, rev)
        self._loaded_at = asyncio.get_running_loop().time()
        return len(nodes) + len(jobs)

    async def _next_rev(self, tx: Transaction) -> int:
        """The revision of this transaction; each transaction takes one."""
        return await checkpoint.next_rev(self.db, tx.session)

    def _committed(self, rev: int | None) -> None:
        """Our own transaction committed: memory is complete up to it if nothing came between."""
        if self.loaded and rev is not None and rev == self.rev + 1:
            self.rev = rev

    def checkpoint_soon(self) -> None:
        if self._checkpointing is None or self._checkpointing.done():
            self._checkpointing = asyncio.create_task(self.write_checkpoint())

    async def write_checkpoint(self) -> None:
        """Write memory as a checkpoint (leader only; skipped when nothing changed)."""
        if not self.loaded or self.rev == self.checkpointed_rev:
            return
        rev, loaded_at = self.rev, self._loaded_at
        t0 = asyncio.get_running_loop().time()
        nodes = [node_doc(v) for v in self.fleet.base.values()]
        jobs = list(self.jobs.values())  # as of `rev`; what changes later has a later rev
        pages = await checkpoint.encode(rev, nodes, jobs)
        if not self.loaded or self._loaded_at != loaded_at:
            return  # memory was found stale and rebuilt meanwhile: what was taken may be too
        await checkpoint.write(self.db, rev, pages)
        self.checkpointed_rev = rev
        log.info(
            "checkpoint at rev %d: %d jobs, %d nodes, %d bytes in %.2f s",
            rev,
            len(self.jobs),
            len(nodes),
            sum(map(len, pages)),
            asyncio.get_running_loop().time() - t0,
        )

    async def sync(self, job_ids: list[str], node_ids: list[str]) -> None:
        """Another instance changed these: read them again (leader only)."""
        if not self.loaded:
            return
        async with self.lock:
            for j in await self.db.jobs.find({"_id": {"$in": job_ids}}).to_list(None):
                self._cache(j)
            if node_ids:
                claims = await self.db.claims.find({"node_id": {"$in": node_ids}}).to_list(None)
                for nid in node_ids:
                    self.fleet.used.pop(nid, None)
                for c in claims:
                    self.fleet._mark(c["node_id"], c["gpu_index"], int(c.get("share", 0)), True)
                for n in await self.db.nodes.find({"_id": {"$in": node_ids}}).to_list(None):
                    self.fleet.upsert(node_view(n))
        self.request_pass()

    async def _changed(self, jobs: list[Doc], node_ids: list[str] | None = None) -> None:
        """After a write: keep memory current here, or tell the leader."""
        if self.loaded:
            for j in jobs:
                self._cache(j)
        elif self.notify is not None:
            with contextlib.suppress(Exception):
                await self.notify([j["_id"] for j in jobs], list(node_ids or []))

    def _cache(self, job: Doc) -> None:
        if job["state"] in OPEN_STATES:
            self.jobs[job["_id"]] = job
        else:
            self.jobs.pop(job["_id"], None)
            self.specs.pop(job["_id"], None)
        self._track(job)

    def _track(self, job: Doc) -> None:
        """Keep `unplaced` current for this job (every change of a job in memory comes
        through here: `_cache`, a pass's new jobs, a load)."""
        waiting = (
            self._waiting_of(job)
            if job["state"] in OPEN_STATES and not job.get("cancel_requested")
            else []
        )
        if waiting:
            self.unplaced[job["_id"]] = waiting
        else:
            self.unplaced.pop(job["_id"], None)

    def _spec(self, job: Doc) -> JobSpec:
        spec = self.specs.get(job["_id"])
        if spec is None:
            spec = self.specs[job["_id"]] = jobdoc.spec_of(job, self.box)
        return spec

    def _req(self, job: Doc) -> Doc:
        """What placement needs of the spec (kept in the job and in checkpoints)."""
        req = job.get("req")
        if req is None:  # a job written before `req` existed
            req = job["req"] = jobdoc.request_of(self._spec(job))
        return cast(Doc, req)

    # --- commands -------------------------------------------------------------------

    async def submit(
        self, spec: JobSpec, account: str, wait: bool = True, request_id: str | None = None
    ) -> Doc:
        """Queue a job for `account` (its creator) in the project its spec names (R-TEN-1):
        owned by that project's owner. With `request_id` (EnqueueJob) the id is derived from
        it, and a job already queued for the same account and request is returned instead of
        a new one.

        The job joins the next placement pass, which stores it in the same transaction as
        its placement (or its reason to wait): one write per job (see `_pass`). An instance
        that does not lead stores it alone and tells the leader."""
        job_id = "j" + uuid.uuid4().hex[:12]
        if request_id is not None:
            job_id = "j" + hashlib.sha256(f"{account}\n{request_id}".encode()).hexdigest()[:12]
            pending = self._pending.get(job_id)
            if pending is not None:  # the same request twice at once: one job
                await asyncio.shield(pending)
                return await self.get(job_id, account)
            existing = await self.db.jobs.find_one({"_id": job_id})
            if existing is not None:
                return jobdoc.view(existing)
        owner, project = await self.projects.resolve(spec.project, account)
        await self.projects.check_plan(owner, tenancy.regional_uses(spec))  # R-TEN-3
        await self._check_region(spec)
        if owner == account:  # created on first use; another's exists (resolve found it)
            await self.projects.ensure(owner, project)
        now = self.clock()
        doc = jobdoc.new_job(
            job_id, spec, account, now, request_id, owner=owner, project=project, box=self.box
        )
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._pending[job_id] = fut
        self._submits.append(Submission(doc, spec, fut))
        self._kick()
        try:
            considered = await fut
        finally:
            self._pending.pop(job_id, None)
        if wait and not considered:
            await self.request_pass()
        cached = self.jobs.get(job_id) if self.loaded else None
        if cached is not None:  # the leader knows it: no read needed
            return jobdoc.view(cached)
        return await self.get(job_id, account)

    async def _store(self, batch: list[Submission]) -> None:
        """Store submissions without placing them (this instance does not lead, or the pass
        that took them failed): one transaction per SUBMIT_BATCH; errors go to the callers."""
        for i in range(0, len(batch), SUBMIT_BATCH):
            part = batch[i : i + SUBMIT_BATCH]

            async def body(tx: Transaction, part: list[Submission] = part) -> int:
                rev = await self._next_rev(tx)
                for s in part:
                    s.doc["rev"] = rev
                    _emit_queued(tx, s)
                await self.db.jobs.insert_many([s.doc for s in part], session=tx.session)
                return rev

            try:
                rev = await self.store.transaction(body)
            except Exception as exc:
                for s in part:
                    if not s.fut.done():
                        s.fut.set_exception(exc)
                continue
            METRICS.jobs_submitted.add(len(part))
            await self._changed([s.doc for s in part])
            self._committed(rev)
            for s in part:
                if not s.fut.done():
                    s.fut.set_result(False)

    async def _check_region(self, spec: JobSpec) -> None:
        """R-RES-1: refuse a pin to a region that has none of the job's GPU types."""
        region = spec.pinned_region
        if region is None:
            return
        found = await self.db.nodes.find_one(
            {"region": region, "gpu_model": {"$in": spec.gpu_types}, "state": {"$ne": "removed"}}
        )
        if found is not None:
            return
        having = sorted(
            {
                n["region"]
                async for n in self.db.nodes.find(
                    {"gpu_model": {"$in": spec.gpu_types}, "state": {"$ne": "removed"}}
                )
            }
        )
        types = " or ".join(spec.gpu_types)
        raise Refused(
            ErrorReply(
                error=ErrorBody(
                    code="invalid",
                    message=f"region {region} has no {types}: the job would never start",
                    fields=[
                        FieldError(
                            field="spec.region",
                            rule="R-RES-1",
                            message=f"region {region} has no {types} node",
                            valid=(
                                "a region with " + types + ": " + ", ".join(having)
                                if having
                                else f"no region has {types} yet"
                            ),
                        )
                    ],
                )
            )
        )

    async def cancel(self, job_id: str, account: str) -> Doc:
        async with self.lock:
            job = await self._job(job_id, account)
            if JobState(job["state"]).terminal:
                return jobdoc.view(job)
            now = self.clock()

            async def body(tx: Transaction) -> None:
                for w in job["workers"]:
                    if w["state"] == WorkerState.waiting.value:
                        w["state"] = WorkerState.stopped.value
                        w["reason"] = "cancelled while waiting"
                    elif w["state"] in HOLDING:
                        emit(tx, self._stop(job, w, "cancelled by user"))
                job["cancel_requested"] = True
                await self._save(tx, job, now, "cancelled by user")

            await self.store.transaction(body)
            await self._changed([job])
            self._committed(job["rev"])
        self.request_pass()
        return await self.get(job_id, account)

    @staticmethod
    def _stop(job: Doc, w: Doc, reason: str) -> StopWorker:
        return StopWorker(
            minion_id=w["minion_id"],
            job_id=job["_id"],
            worker=w["index"],
            placement_id=w["placement_id"],
            reason=reason,
        )

    # --- events ---------------------------------------------------------------------

    async def node_changed(self, evt: NodeRegistered | NodeStateChanged) -> None:
        async with self.lock:
            if isinstance(evt, NodeRegistered):
                models = {g.model for g in evt.gpus}
                mems = [g.memory_mb for g in evt.gpus]
                fields = {
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
                    "updated_ms": now_ms(evt.at),
                }
                await self._write_node(evt.node_id, fields, upsert=True)
                if self.loaded:
                    self.fleet.upsert(node_view({"_id": evt.node_id, **fields}))
            else:
                await self._write_node(
                    evt.node_id, {"state": evt.state.value, "updated_ms": now_ms(evt.at)}
                )
                if self.loaded:
                    self.fleet.set_state(evt.node_id, evt.state.value)
                if evt.state.value in ("lost", "removed"):
                    await self._node_gone(evt)
            if not self.loaded and self.notify is not None:
                with contextlib.suppress(Exception):
                    await self.notify([], [evt.node_id])
        await self.request_pass()

    async def _write_node(self, node_id: str, fields: Doc, upsert: bool = False) -> None:
        async def body(tx: Transaction) -> int:
            rev = await self._next_rev(tx)
            await self.db.nodes.update_one(
                {"_id": node_id},
                {"$set": {**fields, "rev": rev}},
                upsert=upsert,
                session=tx.session,
            )
            return rev

        self._committed(await self.store.transaction(body))

    async def _node_gone(self, evt: NodeStateChanged) -> None:
        """A lost (or removed) node's workers: requeued, or failed for notebooks.

        Training, inference and endpoint workers go back to waiting (a new placement later,
        from their checkpoints); a notebook's interactive state is gone with its node, so
        it fails. A worker lost MAX_REQUEUES times fails too. Its claims are released, the
        run is closed (WorkerFinished `failed`, "node lost": billing stops counting), the
        job's notes record it, and a StopWorker goes to the node in case it comes back.
        """
        jobs = await self.db.jobs.find(
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
        if self.loaded:
            self.fleet.used.pop(evt.node_id, None)
            self.fleet._refresh(evt.node_id)
        await self._changed(changed, [evt.node_id])

    async def _lose_workers(self, job: Doc, hit: list[Doc], evt: NodeStateChanged) -> None:
        spec = JobSpec.model_validate(job["spec"])
        now = self.clock()
        reason = f"node {evt.minion_id} {evt.state.value}"

        async def body(tx: Transaction) -> None:
            for w in hit:
                emit(tx, self._stop(job, w, reason))
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
                )
                await self.db.claims.delete_many(
                    {"placement_id": w["placement_id"]}, session=tx.session
                )
                attempts = [*w.get("attempts", []), jobdoc.attempt(w, reason, now)]
                requeue = spec.type is not JobType.notebook and len(attempts) <= MAX_REQUEUES
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
                        if spec.type is JobType.notebook
                        else f" ({MAX_REQUEUES} requeues used)"
                    )
                job.setdefault("notes", []).append({"at": now, "note": note})
            await self._save(tx, job, now, reason)

        await self.store.transaction(body)

    async def worker_started(self, evt: WorkerStarted, received_at: datetime | None = None) -> None:
        """`received_at`: the stream's timestamp of the event; the node's `started_at` is kept
        within [placed_at, received_at] (a job's shown run time; billing clamps the same)."""
        async with self.lock:
            job = await self.db.jobs.find_one({"_id": evt.job_id})
            w = jobdoc.find_worker(job, evt.worker, evt.placement_id)
            if job is None or w is None or w["state"] != WorkerState.placed.value:
                return  # unknown, superseded or already past this point: nothing to do
            if not jobdoc.reported_by_its_node(w, evt.minion_id):
                return
            started = clamp_time(evt.started_at, w.get("placed_at"), received_at)
            w["state"] = WorkerState.running.value
            w["started_at"] = started

            async def body(tx: Transaction) -> None:
                await self._save(tx, job, started)

            await self.store.transaction(body)
            await self._changed([job])
            self._committed(job["rev"])

    async def worker_finished(
        self, evt: WorkerFinished, received_at: datetime | None = None
    ) -> None:
        """The node's times are clamped as in `worker_started`; the end to [start, received_at]."""
        async with self.lock:
            job = await self.db.jobs.find_one({"_id": evt.job_id})
            w = jobdoc.find_worker(job, evt.worker, evt.placement_id)
            if job is None or w is None or WorkerState(w["state"]).terminal:
                return
            if not jobdoc.reported_by_its_node(w, evt.minion_id):
                return
            claimed = evt.started_at
            started = w.get("started_at") or (
                clamp_time(claimed, w.get("placed_at"), received_at) if claimed else None
            )
            ended = clamp_time(evt.ended_at, started, received_at)
            if w["state"] == WorkerState.placed.value and started is not None:
                # The finish overtook the start (separate consumers): record both, in order.
                w["state"] = WorkerState.running.value
                w["started_at"] = started
                jobdoc.record_state(job, started, None)
            slots = jobdoc.held_slots(w)
            w.update(
                state=evt.state.value,
                exit_code=evt.exit_code,
                reason=evt.reason,
                ended_at=ended,
                started_at=started,
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
                await self._save(tx, job, ended, reason)

            await self.store.transaction(body)
            METRICS.worker_runs.add(1, {"state": evt.state.value})
            if self.loaded and w.get("node_id") in self.fleet.base:
                self.fleet.release(w["node_id"], slots)
            await self._changed([job], [] if self.loaded else [str(w.get("node_id"))])
            self._committed(job["rev"])
        await self.request_pass()

    # --- the queue ------------------------------------------------------------------

    def request_pass(self) -> asyncio.Future[int]:
        """Ask for a placement pass; passes asked for meanwhile are run as one."""
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._pass_waiters.append(fut)
        self._kick()
        return fut

    def _kick(self) -> None:
        if self._passer is None or self._passer.done():
            self._passer = asyncio.create_task(self._run_passes())

    async def _run_passes(self) -> None:
        """Run passes while some are asked for or submissions wait; each pass takes every
        request and up to ADMIT_MAX submissions that came meanwhile."""
        while self._pass_waiters or self._submits or self._explain_more:
            self._explain_more = False
            waiters, self._pass_waiters = self._pass_waiters, []
            batch, self._submits = self._submits[:ADMIT_MAX], self._submits[ADMIT_MAX:]
            try:
                placed = await self.schedule(batch)
            except Exception as exc:  # the next event or resync tries again
                log.exception("placement pass failed")
                self._explain_more = False
                for f in waiters:
                    if not f.done():
                        f.set_exception(exc)
                continue
            finally:
                self.heap.settle()  # the jobs it stored live on: out of the collector's way
            for f in waiters:
                if not f.done():
                    f.set_result(placed)

    async def schedule(self, new: Sequence[Submission] = ()) -> int:
        """One pass: oldest first, backfill, holds for starving workers (queue.py), with
        `new` submissions stored in the pass's transactions. Only the leader places; another
        instance just stores `new`. Returns the number of workers placed."""
        async with self.lock:
            try:
                if not await self.lead():
                    await self._store(list(new))
                    return 0
                loop = asyncio.get_running_loop()
                if loop.time() - self._loaded_at > self.settings.resync_s:
                    await self.catch_up()
                return await self._pass(new)
            except (StaleJob, DuplicateKeyError, BulkWriteError, OperationFailure) as exc:
                log.warning("placement pass lost a race (%s); reloading from the store", exc)
                await self._store(self._unstored(new))
                await self.load()
                return 0
            except Deposed as exc:
                log.warning("%s; placing nothing", exc)
                self.loaded = False
                await self._store(self._unstored(new))
                return 0
            except Exception:
                self.loaded = False  # memory may be ahead of the store: rebuild next time
                await self._store(self._unstored(new))
                raise
            except BaseException:  # cancelled (stopping): nothing more is written
                self.loaded = False
                for sub in self._unstored(new):
                    sub.fut.cancel()
                raise

    def _unstored(self, new: Sequence[Submission]) -> list[Submission]:
        """The submissions a failed pass did not store, taken out of memory again."""
        left = [s for s in new if not s.fut.done()]
        for s in left:
            self.jobs.pop(s.doc["_id"], None)
            self.unplaced.pop(s.doc["_id"], None)
        return left

    def _waiting(self) -> list[Waiting]:
        return [w for ws in self.unplaced.values() for w in ws]

    def _waiting_of(self, job: Doc) -> list[Waiting]:
        out: list[Waiting] = []
        req: Doc | None = None
        for w in job["workers"]:
            if w["state"] != WorkerState.waiting.value:
                continue
            req = req or self._req(job)
            out.append(
                Waiting(
                    req=WorkerRequest(
                        job_id=job["_id"],
                        worker=w["index"],
                        owner=job["owner"],
                        gpu_types=tuple(req["gpu_types"]),
                        gpu_count=int(req["gpu_count"]),
                        max_price=jobdoc.dec(req.get("max_price")),
                        region=req.get("region"),
                        fraction=jobdoc.dec(req.get("fraction")),
                    ),
                    queued_ms=int(job.get("queued_ms") or now_ms(job["queued_at"])),
                )
            )
        return out

    async def _pass(self, new: Sequence[Submission] = ()) -> int:
        now = self.clock()
        started = asyncio.get_running_loop().time()
        fresh = {s.doc["_id"]: s for s in new}
        for s in new:  # they join memory now; their transactions store them (_commit)
            self.jobs[s.doc["_id"]] = s.doc
            self.specs[s.doc["_id"]] = s.spec  # validated once, at submission
            self._track(s.doc)
        slots: list[list[tuple[str, int, int]]] = []

        def claim(p: Placement) -> None:
            s = self.fleet.claims_for(p)
            self.fleet.claim(p.node.node_id, s)
            slots.append(s)

        waiting = self._waiting()
        result = plan(
            waiting,
            self.fleet.index,
            now_ms(now),
            starve_after_ms=int(self.settings.starve_after_s * 1000),
            max_holds=self.settings.max_holds,
            explain_budget=self.settings.explain_budget,
            on_place=claim,
            explained=self._explained,
            pass_no=self._passes,
        )
        self._passes += 1
        self._explain_more = result.never_explained > 0
        self.holds = result.holds
        self.last_pass = result
        by_job: dict[str, list[tuple[Waiting, Placement, list[tuple[str, int, int]]]]] = {}
        for i, (w, p) in enumerate(result.placed):
            by_job.setdefault(w.req.job_id, []).append((w, p, slots[i]))
        changed = self._reasons(result, now)  # new jobs are stored with theirs
        jobs = list(by_job) + [j for j in fresh if j not in by_job]
        for i in range(0, len(jobs), COMMIT_CHUNK):  # the relay starts on the first chunk
            chunk = jobs[i : i + COMMIT_CHUNK]
            await self._commit({j: by_job.get(j, []) for j in chunk}, fresh, now)
        stored = [c for c in changed if c[0] not in fresh]
        explained = await self._explain(result, stored, now)
        METRICS.jobs_placed.add(len(result.placed))
        METRICS.set_queue_depth(len(waiting) - len(result.placed))
        took = asyncio.get_running_loop().time() - started
        if len(result.placed) + explained > CHECKPOINT_AFTER:
            self.checkpoint_soon()  # a restart should not read all of that again
        if took > 1.0 or self._first_pass:
            log.info(
                "%s: %d placed, %d waiting, %d submitted, %.2f s",
                "first pass after loading" if self._first_pass else "long pass",
                len(result.placed),
                len(waiting) - len(result.placed),
                len(new),
                took,
            )
        self._first_pass = False
        return len(result.placed)

    async def _commit(
        self,
        by_job: dict[str, list[tuple[Waiting, Placement, list[tuple[str, int, int]]]]],
        fresh: dict[str, Submission],
        now: datetime,
    ) -> None:
        """One fenced transaction: the placements of these jobs, and the jobs of `fresh`
        among them inserted (placed or with their reason to wait) with their JobQueued."""
        docs: dict[str, Doc] = {}
        partial = [j for j in by_job if self.jobs[j].get("partial")]
        if partial:  # known from a checkpoint: the whole document is needed now
            for full in await self.db.jobs.find({"_id": {"$in": partial}}).to_list(None):
                self.jobs[full["_id"]] = full
        unreadable = self._unreadable(by_job)

        async def body(tx: Transaction) -> int:
            docs.clear()
            docs.update({j: jobdoc.copy_job(self.jobs[j]) for j in by_job})
            epoch = await self.lease.fence(tx.session)
            rev = await self._next_rev(tx)
            claims: list[Doc] = []
            inserts: list[Doc] = []
            replaces: list[ReplaceOne[Doc]] = []
            for job_id, items in by_job.items():
                job = docs[job_id]
                sub = fresh.get(job_id)
                if sub is not None:
                    _emit_queued(tx, sub)
                if job_id in unreadable:
                    job["rev"] = rev
                    replaces.append(self._fail_unreadable(tx, job, now))
                    continue
                if items:
                    spec = self._spec(job)
                    for wt, p, s in items:
                        w = next(x for x in job["workers"] if x["index"] == wt.req.worker)
                        claims += placing.place_worker(tx, job, spec, w, p, s, now, epoch)
                    job["queue_reason"] = None
                    job["queue_detail"] = []
                job["rev"] = rev
                if sub is None:
                    replaces.append(self._replace(tx, job, now))
                else:
                    if items:
                        self._bump(tx, job, now, None)
                    inserts.append(job)
            if claims:
                await self.db.claims.insert_many(claims, session=tx.session)
            if inserts:
                await self.db.jobs.insert_many(inserts, session=tx.session)
            if replaces:
                res = await self.db.jobs.bulk_write(replaces, ordered=False, session=tx.session)
                if res.matched_count != len(replaces):
                    raise StaleJob(f"{len(replaces) - res.matched_count} jobs changed")
            return rev

        rev = await self.store.transaction(body)
        for job in docs.values():
            self._cache(job)
        self._committed(rev)
        stored = [fresh[j] for j in by_job if j in fresh]
        if stored:
            METRICS.jobs_submitted.add(len(stored))
        for sub in stored:
            if not sub.fut.done():
                sub.fut.set_result(True)

    def _unreadable(
        self, by_job: dict[str, list[tuple[Waiting, Placement, list[tuple[str, int, int]]]]]
    ) -> set[str]:
        """The jobs of a pass whose secrets this key cannot open: their placements are given
        back (they fail instead, `_fail_unreadable`)."""
        out: set[str] = set()
        for job_id, items in by_job.items():
            if not items:
                continue
            try:
                self._spec(self.jobs[job_id])
            except SecretError:
                out.add(job_id)
                for _, p, slots in items:
                    self.fleet.release(p.node.node_id, [(g, sh) for _, g, sh in slots])
        return out

    def _fail_unreadable(self, tx: Transaction, job: Doc, now: datetime) -> ReplaceOne[Doc]:
        log.error("job %s: its secrets do not decrypt with GPUFLEET_SECRET_KEY", job["_id"])
        for w in job["workers"]:
            if w["state"] == WorkerState.waiting.value:
                w.update(state=WorkerState.failed.value, reason=UNREADABLE, ended_at=now)
        job["queue_reason"] = None
        job["queue_detail"] = []
        return self._replace(tx, job, now, UNREADABLE)

    def _reasons(self, result: PassResult, now: datetime) -> list[tuple[str, Doc]]:
        """The reasons this pass explained, made current in memory; returns the (job,
        fields) that changed and must be stored."""
        per_job: dict[str, NoPlacement] = {}
        for w in result.waiting:
            r = result.reasons.get(w.key)
            if r is not None and w.req.job_id not in per_job:
                per_job[w.req.job_id] = r
        # Jobs of one request shape share their reason object: worded once, not once a job.
        said: dict[int, tuple[str, list[dict[str, object]]]] = {}
        at = now_ms(now)
        sets: list[tuple[str, Doc]] = []
        for job_id, r in per_job.items():
            job = self.jobs.get(job_id)
            if job is None:
                continue
            if id(r) not in said:
                said[id(r)] = (r.explain(), r.structured())
            text, detail = said[id(r)]
            if job.get("queue_reason") == text:
                continue
            fields = {"queue_reason": text, "queue_detail": detail, "explained_ms": at}
            job.update(fields)
            sets.append((job_id, fields))
        return sets

    async def _explain(
        self,
        result: PassResult,
        sets: list[tuple[str, Doc]],
        now: datetime,
    ) -> int:
        """Store the reasons that changed (`_reasons`); say when unplaceable demand changes.
        Returns how many jobs' reasons were rewritten."""
        if sets:

            async def write(tx: Transaction) -> int:
                rev = await self._next_rev(tx)
                updates = [UpdateOne({"_id": j}, {"$set": {**f, "rev": rev}}) for j, f in sets]
                await self.db.jobs.bulk_write(updates, ordered=False, session=tx.session)
                return rev

            self._committed(await self.store.transaction(write))
        # Each waiting worker with its job's current reason (explained in this pass or, for
        # a shape over this pass's budget, an earlier one).
        demand = frozenset(
            (w.req.job_id, w.req.worker, self._reason_of(w.req.job_id)) for w in result.waiting
        )
        if demand == self._demand:
            return len(sets)
        self._demand = demand
        oldest = sorted(result.waiting, key=lambda w: w.queued_ms)[
            : PendingDemandChanged.MAX_DEMANDS
        ]
        demands = [self._demand_of(w) for w in oldest]
        waiting = len(result.waiting)

        async def body(tx: Transaction) -> None:
            emit(
                tx,
                PendingDemandChanged(demands=[d for d in demands if d], at=now, waiting=waiting),
            )

        await self.store.transaction(body)
        return len(sets)

    def _reason_of(self, job_id: str) -> str | None:
        job = self.jobs.get(job_id)
        return None if job is None else job.get("queue_reason")

    def _demand_of(self, w: Waiting) -> Demand | None:
        job = self.jobs.get(w.req.job_id)
        if job is None:
            return None
        req = self._req(job)
        return Demand(
            job_id=w.req.job_id,
            worker=w.req.worker,
            owner=w.req.owner,
            project=req["project"],
            gpu_types=list(w.req.gpu_types),
            gpu_count=w.req.gpu_count,
            max_price=w.req.max_price,
            region=w.req.region,
            burst_allowed=bool(req["allow_burst"]),
            waiting_since=from_ms(w.queued_ms) or self.clock(),
            gpu_fraction=w.req.fraction,
            reason=job.get("queue_reason"),
        )

    # --- queries --------------------------------------------------------------------

    async def get(self, job_id: str, account: str) -> Doc:
        return jobdoc.view(await self._job(job_id, account))

    async def document(self, job_id: str, account: str) -> Doc:
        """The stored job, if `account` may see it (NotFound otherwise, R-TEN-2)."""
        return await self._job(job_id, account)

    async def list(self, account: str, limit: int = 100) -> list[Doc]:
        """The jobs `account` owns (its projects') or created (in others'), newest first."""
        query = tenancy.visible_to(account)
        jobs = await self.db.jobs.find(query).sort("queued_at", -1).to_list(limit)
        return [jobdoc.view(j) for j in jobs]

    # --- helpers --------------------------------------------------------------------

    async def _job(self, job_id: str, account: str) -> Doc:
        """The job if `account` owns or created it (tenancy.py): the jobs it may read,
        cancel and read the logs of."""
        job = await self.db.jobs.find_one({"_id": job_id, **tenancy.visible_to(account)})
        if job is None:  # another account's job answers "not found" too (R-TEN-2)
            raise NotFound(f"job {job_id} not found")
        return job

    def _bump(self, tx: Transaction, job: Doc, at: datetime, reason: str | None) -> int:
        """Record the job's new state (and its event); returns the version it had."""
        previous = jobdoc.record_state(job, at, reason)
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
        version = int(job["version"])
        job["version"] = version + 1
        job["updated_at"] = self.clock()
        return version

    def _replace(
        self, tx: Transaction, job: Doc, at: datetime, reason: str | None = None
    ) -> ReplaceOne[Doc]:
        version = self._bump(tx, job, at, reason)
        return ReplaceOne({"_id": job["_id"], "version": version}, job)

    async def _save(
        self, tx: Transaction, job: Doc, at: datetime, reason: str | None = None
    ) -> None:
        job["rev"] = await self._next_rev(tx)
        version = self._bump(tx, job, at, reason)
        res = await self.db.jobs.replace_one(
            {"_id": job["_id"], "version": version}, job, session=tx.session
        )
        if res.matched_count != 1:
            job["version"] = version
            raise StaleJob(job["_id"])


def _emit_queued(tx: Transaction, sub: Submission) -> None:
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
    )


def clamp_time(at: datetime, lo: object, hi: datetime | None) -> datetime:
    """A node's claimed time kept within [lo, hi]: not after `hi` (when its report was
    received), not before `lo` (a stored time: the placement, or the start)."""
    at = _aware(at)
    if hi is not None:
        at = min(at, _aware(hi))
    if isinstance(lo, datetime):
        at = max(at, _aware(lo))
    return at


def _aware(at: datetime) -> datetime:
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)
