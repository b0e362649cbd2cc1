"""What the scheduler answers about jobs: one job, an account's jobs, a job's logs, and to
operators every account's jobs.

A job is visible to its owner and its creator only (tenancy.py, R-TEN-2): another account's
job answers "not found", like one that does not exist. Operators (the admin subject, which
only their credentials may publish) see every job.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from gpufleet_contracts.jobs import JobState
from gpufleet_store import Doc
from nats.js import JetStreamContext

from . import jobdoc, tenancy
from .logs import read_logs
from .state import State

JetStream = Callable[[], Awaitable[JetStreamContext]]


class Queries:
    def __init__(
        self, state: State, jetstream: JetStream | None = None, inbox_prefix: bytes = b"_INBOX."
    ) -> None:
        self.state = state
        self.jetstream = jetstream  # the broker's (app.py); None: logs cannot be read
        self.inbox_prefix = inbox_prefix

    async def get(self, job_id: str, account: str) -> Doc:
        """The job's view (jobdoc.view), if `account` may see it."""
        return jobdoc.view(await self.state.find_job(job_id, account))

    async def document(self, job_id: str, account: str) -> Doc:
        """The stored job, if `account` may see it (NotFound otherwise, R-TEN-2)."""
        return await self.state.find_job(job_id, account)

    async def list_all(
        self, limit: int = 100, account: str | None = None, state: JobState | None = None
    ) -> list[Doc]:
        """Every account's jobs (or those `account` owns or created), newest first; only
        those in `state` if given. For operators."""
        query: Doc = tenancy.visible_to(account) if account is not None else {}
        if state is not None:
            query["state"] = state.value
        jobs = await self.state.db.jobs.find(query).sort("queued_at", -1).to_list(limit)
        return [jobdoc.view(j) for j in jobs]

    async def list(self, account: str, limit: int = 100) -> list[Doc]:
        """The jobs `account` owns (its projects') or created (in others'), newest first."""
        query = tenancy.visible_to(account)
        jobs = await self.state.db.jobs.find(query).sort("queued_at", -1).to_list(limit)
        return [jobdoc.view(j) for j in jobs]

    async def logs(
        self,
        job_id: str,
        account: str,
        after: int,
        limit: int,
        cursor: Mapping[str, int] | None = None,
    ) -> Doc:
        """A page of the job's worker logs (logs.py), if `account` may see the job."""
        job = await self.state.find_job(job_id, account)
        if self.jetstream is None:
            raise RuntimeError("this scheduler reads no logs (built without a bus)")
        js = await self.jetstream()
        return await read_logs(js, job, after, limit, self.inbox_prefix, cursor)
