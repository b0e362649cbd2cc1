"""The scheduler's core: one state (state.py) and the parts that depend on it.

    State ── memory (lead, load, catch up, checkpoints)
      │  └── passes (placement passes; commit.py writes them) ── admission (submissions)
      │                                                      ├── lifecycle (nodes, cancel)
      │                                                      └── reports (workers' reports)
      └── queries (jobs, logs)          projects (projects and plans, its own collections)
                                        keys (accounts' attached keys, sealed: keystore.py)

Every part depends on the state, none the other way; app.py wires their functions to
subjects. Beside them, pure: placement.py, index.py and queue.py (the pass's decisions),
fleet.py (the fleet in memory), jobdoc.py (a job's document) and jobrequest.py (a job's
request and its stored forms).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from datetime import datetime

from gpufleet_contracts.errors import Refused
from gpufleet_contracts.jobs import EnqueueJob, JobRejected, SchedulerSync
from gpufleet_store import Store

from . import projects
from .admission import Admission
from .keystore import KeyStore
from .leadership import Lease
from .lifecycle import Lifecycle
from .memory import Memory
from .passes import Passes
from .queries import JetStream, Queries
from .reports import Reports
from .settings import SchedulerSettings
from .state import Notify, State

log = logging.getLogger("gpufleet.scheduler")


class Scheduler:
    def __init__(
        self,
        store: Store,
        clock: Callable[[], datetime],
        *,
        lease: Lease | None = None,
        settings: SchedulerSettings | None = None,
        notify: Notify | None = None,
        jetstream: JetStream | None = None,
        inbox_prefix: bytes = b"_INBOX.",
    ) -> None:
        self.state = State(
            store,
            clock,
            lease=lease or Lease(store.db),
            settings=settings or SchedulerSettings(),
            notify=notify,
        )
        self.projects = projects.Projects(store)  # projects and plans (R-TEN-1, R-TEN-3)
        self.keys = KeyStore(store, self.state.box)  # attached third-party keys (R-JOB-7)
        self.memory = Memory(self.state)
        self.passes = Passes(self.state, self.memory)
        self.admission = Admission(self.state, self.passes, self.projects, self.keys)
        self.lifecycle = Lifecycle(self.state, self.passes)
        self.reports = Reports(self.state, self.passes, jetstream)
        self.queries = Queries(self.state, jetstream, inbox_prefix)

    async def enqueue(self, cmd: EnqueueJob, account: str) -> JobRejected | None:
        """Another system's submission (EnqueueJob); its refusal is an event, JobRejected."""
        try:
            await self.admission.submit(cmd.spec, account, wait=False, request_id=cmd.request_id)
        except Refused as exc:
            at = self.state.clock()
            return JobRejected(
                request_id=cmd.request_id, account=account, error=exc.reply.error, at=at
            )
        return None

    async def sync(self, note: SchedulerSync) -> None:
        """Another instance changed these jobs and nodes (leader only)."""
        await self.memory.sync(note.jobs, note.nodes)
        if self.state.loaded:
            self.passes.request_pass()

    async def start(self) -> None:
        """The first pass: jobs that were queued while the scheduler was down."""
        await self.passes.schedule()

    async def renew(self) -> None:
        """Renew the lease through a pass (a newly elected leader rebuilds its memory and runs
        the queue)."""
        with contextlib.suppress(Exception):
            await self.passes.request_pass()

    async def checkpoint(self) -> None:
        self.memory.checkpoint_soon()

    async def stop(self) -> None:
        """In this order: no pass after the one under way (none renews the lease), the
        final checkpoint, the lease given up."""
        await self.passes.close()
        if self.state.loaded:  # the next leader starts from here, not from every document
            try:
                await self.memory.write_checkpoint()
            except Exception:
                log.exception("checkpoint at stop failed")
        with contextlib.suppress(Exception):
            await self.state.lease.release()
