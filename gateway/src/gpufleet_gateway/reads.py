"""What a person may read, asked on their own connections: their account's objects, or (an
operator) every account's. Each function takes the signed-in person and returns contract
models; the account a request acts for is always the connection's."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from gpufleet_client import ClientError
from gpufleet_contracts.alerts import AlertList, ListAlerts, ListAllAlerts
from gpufleet_contracts.billing import LedgerSeries, LedgerSeriesQuery, Period
from gpufleet_contracts.identity import Accounts, ListAccounts
from gpufleet_contracts.jobs import GetJob, GetJobLogs, ListAllJobs, ListJobs
from gpufleet_contracts.jobviews import JobList, JobLogs, JobView
from gpufleet_contracts.nodes import ListNodes, NodeList, NodeView

from .sessions import Person

T = TypeVar("T")
JOBS_LISTED = 500
LOG_PAGES = 4  # pages of a job's log read for its tail


async def accounts(person: Person) -> list[str]:
    """The accounts a person sees: their own, or (an operator) every account."""
    if person.account is not None:
        return [person.account]
    listed = await (await person.client()).ask(ListAccounts(), Accounts)
    return [a.account for a in listed.accounts]


async def each_account(person: Person, read: Callable[[str], Awaitable[T]]) -> list[T]:
    """`read(account)` for every account the person sees, at once."""
    return list(await asyncio.gather(*(read(a) for a in await accounts(person))))


async def nodes(person: Person) -> list[NodeView]:
    async def of(account: str) -> list[NodeView]:
        return (await (await person.client(account)).ask(ListNodes(), NodeList)).nodes

    return [n for listed in await each_account(person, of) for n in listed]


async def jobs(person: Person) -> list[JobView]:
    """Newest first: the account's own, or (an operator) every account's."""
    client = await person.client()
    if person.operator:
        return (await client.ask(ListAllJobs(limit=JOBS_LISTED), JobList)).jobs
    return (await client.ask(ListJobs(limit=JOBS_LISTED), JobList)).jobs


async def job(person: Person, job_id: str, account: str | None) -> tuple[JobView, JobLogs | None]:
    """A job and the last pages of its logs (None: its logs cannot be read now)."""
    client = await person.client(account)
    view = await client.ask(GetJob(job_id=job_id), JobView)
    logs: JobLogs | None = None
    try:
        cursor: dict[str, int] = {}
        for _ in range(LOG_PAGES):
            page = await client.ask(GetJobLogs(job_id=job_id, cursor=cursor), JobLogs)
            logs = page if logs is None or page.chunks else logs
            cursor = page.cursor
            if not page.more:
                break
    except ClientError:
        pass
    return view, logs


async def costs(person: Person, period: Period) -> list[LedgerSeries]:
    async def of(account: str) -> LedgerSeries:
        return await (await person.client(account)).ask(
            LedgerSeriesQuery(period=period), LedgerSeries
        )

    return await each_account(person, of)


async def alerts(person: Person) -> AlertList:
    if person.operator:
        return await (await person.client()).ask(ListAllAlerts(limit=200), AlertList)
    return await (await person.client()).ask(ListAlerts(limit=200), AlertList)
