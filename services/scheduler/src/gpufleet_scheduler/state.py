"""The scheduler's state: the leader's memory, its revision, and how a job is written.

State lives in the database; the leading instance (leadership.py) also keeps the open jobs
and the fleet in memory (`fleet.py`, indexed for placement), rebuilt by memory.py when it
starts or takes the lead. Every change is one transaction that takes the next revision
(checkpoint.py) and writes the events it causes to the outbox. Admission, the placement
passes, the lifecycle of nodes and workers, and the queries depend on this module; it depends
on none of them.

Any instance answers requests and handles events (writing to the store); an instance that
does not lead tells the leader which jobs and nodes changed (`changed`, the sync subject), so
the leader's memory follows; a periodic reload bounds the staleness should such a note be
lost.

Transactions on one database run one at a time in a process (`Store.transaction`): nx-27017
cannot interleave two transactions at all ("no such savepoint", and the failed one may be
left half-applied), even from one client. Two scheduler *processes* against nx-27017 can
still collide; run one scheduler process with nx-27017 (as `just up` does). MongoDB has no
such limit, and there the lease's fencing is what keeps a second instance harmless.

Secrets (a job's env values, R-JOB-7) are sealed with the scheduler's key (settings
`secret_key`, GPUFLEET_SECRET_KEY) wherever they are stored: the job document
(jobrequest.py) and the outbox row of the worker's StartWorker (`emit(sealed=True)`).
JobQueued and every reply carry the env names with "<secret>" values.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime

from gpufleet_bus import emit
from gpufleet_contracts.errors import NotFound
from gpufleet_contracts.jobs import JobSpec, JobState, JobStateChanged, WorkerState
from gpufleet_store import Doc, Store, Transaction, now_ms
from pymongo import ReplaceOne

from . import checkpoint, jobdoc, jobrequest, tenancy
from .fleet import Fleet
from .heap import Heap
from .jobrequest import JobRequest
from .leadership import Lease
from .placement import WorkerRequest
from .queue import Waiting
from .settings import SchedulerSettings

log = logging.getLogger("gpufleet.scheduler")

OPEN_STATES = [
    JobState.queued.value,
    JobState.starting.value,
    JobState.running.value,
    JobState.uploading.value,
]
# A worker that holds its GPUs: an uploading one still does (and is still billed).
HOLDING = (WorkerState.placed.value, WorkerState.running.value, WorkerState.uploading.value)
Notify = Callable[[list[str], list[str]], Awaitable[None]]


class StaleJob(Exception):
    """The job changed under us (optimistic concurrency); the caller reloads and retries."""


class State:
    def __init__(
        self,
        store: Store,
        clock: Callable[[], datetime],
        *,
        lease: Lease,
        settings: SchedulerSettings,
        notify: Notify | None = None,
    ) -> None:
        self.store = store
        self.db = store.db
        self.clock = clock
        self.lease = lease
        self.settings = settings
        self.box = settings.box()
        store.box = self.box  # the outbox seals the StartWorker that carries a job's env
        self.notify = notify  # tells the leader what changed (set by the app)
        self.lock = asyncio.Lock()
        # --- memory, while leading (memory.py builds it) ---
        self.loaded = False
        self.fleet = Fleet()
        self.jobs: dict[str, Doc] = {}  # open jobs
        self.requests: dict[str, JobRequest] = {}  # what each open job asks for (decoded once)
        # The waiting workers of each job that has some, kept current by `track` whenever a
        # job enters memory: a pass reads them instead of walking every open job.
        self.unplaced: dict[str, list[Waiting]] = {}
        self.explained: dict[tuple[object, ...], int] = {}  # shape -> pass that explained it
        self.rev = 0  # memory holds every change up to this revision (checkpoint.py)
        self.checkpointed_rev = 0
        self.loaded_at = 0.0
        self.loaded_from = ""  # "documents" or "checkpoint at rev N"
        self.heap = Heap()  # freezes long-lived memory after loads and passes (heap.py)

    def forget(self) -> None:
        """No longer leading: memory is dropped (rebuilt should this instance lead again)."""
        self.loaded = False
        self.jobs.clear()
        self.requests.clear()
        self.unplaced.clear()

    # --- memory -----------------------------------------------------------------------

    def cache(self, job: Doc) -> None:
        """A job as stored now: kept while open, forgotten once closed."""
        if job["state"] in OPEN_STATES:
            self.jobs[job["_id"]] = job
        else:
            self.jobs.pop(job["_id"], None)
            self.requests.pop(job["_id"], None)
        self.track(job)

    def admit(self, doc: Doc, spec: JobSpec) -> None:
        """A submission joins memory (its pass's transaction stores it)."""
        self.jobs[doc["_id"]] = doc
        self.requests[doc["_id"]] = jobrequest.of_spec(spec, doc["project"])
        self.track(doc)

    def drop(self, job_id: str) -> None:
        """A submission a failed pass did not store, out of memory again."""
        self.jobs.pop(job_id, None)
        self.requests.pop(job_id, None)
        self.unplaced.pop(job_id, None)

    def track(self, job: Doc) -> None:
        """Keep `unplaced` current for this job (every change of a job in memory comes
        through here: `cache`, a pass's new jobs, a load)."""
        waiting = (
            self.waiting_of(job)
            if job["state"] in OPEN_STATES and not job.get("cancel_requested")
            else []
        )
        if waiting:
            self.unplaced[job["_id"]] = waiting
        else:
            self.unplaced.pop(job["_id"], None)

    def waiting(self) -> list[Waiting]:
        return [w for ws in self.unplaced.values() for w in ws]

    def waiting_of(self, job: Doc) -> list[Waiting]:
        out: list[Waiting] = []
        req: JobRequest | None = None
        for w in job["workers"]:
            if w["state"] != WorkerState.waiting.value:
                continue
            req = req or self.request(job)
            out.append(
                Waiting(
                    req=WorkerRequest(
                        job_id=job["_id"],
                        worker=w["index"],
                        owner=job["owner"],
                        gpu_types=req.gpu_types,
                        gpu_count=req.gpu_count,
                        max_price=req.max_price,
                        region=req.region,
                        fraction=req.fraction,
                        cpu_count=req.cpu_count,
                        secrets=req.secrets,
                        environment=req.environment,
                    ),
                    queued_ms=int(job.get("queued_ms") or now_ms(job["queued_at"])),
                )
            )
        return out

    def request(self, job: Doc) -> JobRequest:
        """What the job asks for (jobrequest.py), decoded once while it is open."""
        req = self.requests.get(job["_id"])
        if req is None:
            req = jobrequest.decode(job)
            if job["_id"] in self.jobs:  # kept while the job is in memory
                self.requests[job["_id"]] = req
        return req

    def spec(self, job: Doc) -> JobSpec:
        """The job's whole spec, secrets opened (SecretError: this key cannot open them)."""
        req = self.request(job)
        if req.spec is None:
            req = req.with_spec(jobrequest.spec_of(job, self.box))
            if job["_id"] in self.requests:
                self.requests[job["_id"]] = req
        assert req.spec is not None
        return req.spec

    def claims(self) -> list[Doc]:
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

    # --- revisions --------------------------------------------------------------------

    async def next_rev(self, tx: Transaction) -> int:
        """The revision of this transaction; each transaction takes one."""
        return await checkpoint.next_rev(self.db, tx.session)

    def committed(self, rev: int | None) -> None:
        """Our own transaction committed: memory is complete up to it if nothing came between."""
        if self.loaded and rev is not None and rev == self.rev + 1:
            self.rev = rev

    async def changed(self, jobs: list[Doc], node_ids: list[str] | None = None) -> None:
        """After a write: keep memory current here, or tell the leader."""
        if self.loaded:
            for j in jobs:
                self.cache(j)
        elif self.notify is not None:
            with contextlib.suppress(Exception):
                await self.notify([j["_id"] for j in jobs], list(node_ids or []))

    # --- job writes -------------------------------------------------------------------

    async def find_job(self, job_id: str, account: str) -> Doc:
        """The job if `account` owns or created it (tenancy.py): the jobs it may read,
        cancel and read the logs of."""
        job = await self.db.jobs.find_one({"_id": job_id, **tenancy.visible_to(account)})
        if job is None:  # another account's job answers "not found" too (R-TEN-2)
            raise NotFound(f"job {job_id} not found")
        return job

    def bump(self, tx: Transaction, job: Doc, at: datetime, reason: str | None) -> int:
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
                trace=job.get("trace"),
            )
        version = int(job["version"])
        job["version"] = version + 1
        job["updated_at"] = self.clock()
        return version

    def replace(
        self, tx: Transaction, job: Doc, at: datetime, reason: str | None = None
    ) -> ReplaceOne[Doc]:
        version = self.bump(tx, job, at, reason)
        return ReplaceOne({"_id": job["_id"], "version": version}, job)

    async def save(
        self, tx: Transaction, job: Doc, at: datetime, reason: str | None = None
    ) -> None:
        job["rev"] = await self.next_rev(tx)
        version = self.bump(tx, job, at, reason)
        res = await self.db.jobs.replace_one(
            {"_id": job["_id"], "version": version}, job, session=tx.session
        )
        if res.matched_count != 1:
            job["version"] = version
            raise StaleJob(job["_id"])
