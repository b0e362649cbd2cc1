"""The JSON API the pages read, and the actions they take: each route asks on the signed-in
person's own connection and answers a model. No route takes the acting account from the
request: a user's connection acts for its own account whatever is asked; only an operator's
`account` query parameter chooses which account's connection an action goes on."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import StreamingResponse
from gpufleet_client import ClientError
from gpufleet_contracts.alerts import AlertList
from gpufleet_contracts.billing import LedgerSeries, Period
from gpufleet_contracts.identity import (
    AccountName,
    AccountView,
    CreateAccount,
    Plan,
    RemoveAccount,
    RemovedAccount,
)
from gpufleet_contracts.jobs import CancelJob
from gpufleet_contracts.jobviews import JobView
from gpufleet_contracts.nodes import MaintenanceSet, SetMaintenance
from pydantic import BaseModel

from . import reads, views
from .sessions import Person, Sessions

COOKIE = "gpufleet_session"
Account = Annotated[str | None, Query(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")]


class Me(BaseModel):
    account: str | None
    operator: bool
    expires_at: float


class Alerts(BaseModel):
    alerts: AlertList
    unavailable: str | None = None  # why none could be read (the alert rules not running)


class Maintenance(BaseModel):
    maintenance: bool


class NewAccount(BaseModel):
    account: str
    plan: Plan = Plan.free


class Snapshot(BaseModel):
    """What a live page is sent on each change."""

    fleet: views.Fleet
    queue: views.Queue


async def taken(person: Person) -> Snapshot:
    nodes, jobs = await asyncio.gather(reads.nodes(person), reads.jobs(person))
    return Snapshot(fleet=views.fleet(nodes), queue=views.queue(jobs))


def sessions_of(request: Request) -> Sessions:
    sessions: Sessions = request.app.state.sessions
    return sessions


def signed_in(request: Request) -> Person:
    person = sessions_of(request).find(request.cookies.get(COOKIE))
    if person is None:
        raise HTTPException(401, "not signed in: run `gpufleet console login`")
    return person


def operator(person: Annotated[Person, Depends(signed_in)]) -> Person:
    if not person.operator:
        raise HTTPException(403, "operators only")
    return person


Signed = Annotated[Person, Depends(signed_in)]
Operator = Annotated[Person, Depends(operator)]


def router(sessions: Sessions, refresh_s: float) -> APIRouter:
    """The API over `sessions` (also the app's `state.sessions`, where routes find them)."""
    api = APIRouter(prefix="/api")

    @api.get("/me")
    async def me(person: Signed) -> Me:
        return Me(account=person.account, operator=person.operator, expires_at=person.expires_at)

    @api.get("/fleet")
    async def fleet(
        person: Signed, region: str | None = None, node: str | None = None
    ) -> views.Fleet:
        return views.fleet(await reads.nodes(person), region, node)

    @api.get("/queue")
    async def queue(person: Signed) -> views.Queue:
        return views.queue(await reads.jobs(person))

    @api.get("/jobs/{job_id}")
    async def job(person: Signed, job_id: str, account: Account = None) -> views.JobPage:
        return views.job_page(*await reads.job(person, job_id, account))

    @api.post("/jobs/{job_id}/cancel")
    async def cancel(person: Signed, job_id: str, account: Account = None) -> JobView:
        return await (await person.client(account)).ask(CancelJob(job_id=job_id), JobView)

    @api.post("/nodes/{node}/maintenance")
    async def maintenance(
        person: Signed, node: str, body: Maintenance, account: Account = None
    ) -> MaintenanceSet:
        request = SetMaintenance(node=node, maintenance=body.maintenance)
        return await (await person.client(account)).ask(request, MaintenanceSet)

    @api.get("/costs")
    async def costs(person: Signed, period: Period = "day") -> list[LedgerSeries]:
        return await reads.costs(person, period)

    @api.get("/alerts")
    async def alerts(person: Signed) -> Alerts:
        try:
            return Alerts(alerts=await reads.alerts(person))
        except ClientError as exc:
            if exc.code not in ("unavailable", "forbidden"):
                raise
            return Alerts(alerts=AlertList(alerts=[]), unavailable=exc.message)

    @api.get("/accounts")
    async def accounts(person: Operator) -> list[str]:
        return await reads.accounts(person)

    @api.post("/accounts")
    async def add_account(person: Operator, body: NewAccount) -> AccountView:
        request = CreateAccount(account=body.account, plan=body.plan)
        return await (await person.client()).ask(request, AccountView)

    @api.delete("/accounts/{account}")
    async def remove_account(person: Operator, account: AccountName) -> RemovedAccount:
        """Refused (409) while the account holds nodes; 404 once removed (provisioner)."""
        return await (await person.client()).ask(RemoveAccount(account=account), RemovedAccount)

    @api.get("/snapshot")
    async def snapshot(person: Signed) -> Snapshot:
        """What a live page shows, once (the live stream sends it on each change)."""
        return await taken(person)

    @api.get("/live")
    async def live(request: Request, person: Signed) -> StreamingResponse:
        """Server-sent events: the fleet and the queue, sent again each time they change."""

        async def events() -> AsyncIterator[str]:
            last = ""
            while sessions.find(person.session_id) is person:
                if await request.is_disconnected():
                    return
                try:
                    data = (await taken(person)).model_dump_json()
                except ClientError as exc:
                    data = json.dumps({"error": {"code": exc.code, "message": exc.message}})
                if data != last:
                    last = data
                    yield f"event: snapshot\ndata: {data}\n\n"
                else:
                    yield ": unchanged\n\n"
                await asyncio.sleep(refresh_s)
            yield "event: signed_out\ndata: {}\n\n"

        return StreamingResponse(
            events(), media_type="text/event-stream", headers={"Cache-Control": "no-store"}
        )

    return api


def refusal_status(code: str) -> int:
    """The HTTP status of a refusal's code (errors.py's codes)."""
    return {
        "invalid": 422,
        "not_found": 404,
        "forbidden": 403,
        "unauthenticated": 401,
        "conflict": 409,
        "unavailable": 503,
    }.get(code, 500 if code == "internal" else 400)


def refusal_body(exc: ClientError) -> dict[str, Any]:
    fields = [f.model_dump() for f in getattr(exc, "fields", [])]
    return {"error": {"code": exc.code, "message": exc.message, "fields": fields}}
