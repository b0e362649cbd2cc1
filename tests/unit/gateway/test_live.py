"""The console's live stream (SSE): a snapshot when the fleet or the queue changed, a comment
otherwise. A queued job's wait is counted in the browser from its queued time, so a queue whose
jobs only keep waiting is not sent again."""

from __future__ import annotations

import json
import tempfile
from typing import Any

import httpx
from fastapi import FastAPI
from gpufleet_auth import Authority, Creds
from gpufleet_contracts.console import ConsoleSession
from gpufleet_contracts.jobs import ListJobs
from gpufleet_contracts.jobviews import JobList
from gpufleet_contracts.nodes import NodeList
from gpufleet_gateway.api import COOKIE, router
from gpufleet_gateway.sessions import Sessions

from .test_views import job

TICKS = 4  # reads of the queue before the session ends
EXPIRES_AT = 2_000_000_000


class Account:
    """A person's connection, answering the reads with one account's unchanged objects; the
    session's clock passes its expiry after TICKS reads of the queue, which ends the stream."""

    def __init__(self, now: list[float]) -> None:
        self.now = now
        self.nc = self
        self.is_closed = False
        self.reads = 0

    async def ask(self, request: Any, reply: type[Any]) -> Any:
        if isinstance(request, ListJobs):
            self.reads += 1
            if self.reads >= TICKS:
                self.now[0] = EXPIRES_AT
            waiting = job("j-1", "queued", "2026-11-27T11:50:00", queue_reason="busy")
            return JobList(jobs=[waiting])
        assert reply is NodeList, request
        return NodeList(nodes=[])

    async def close(self) -> None:
        self.is_closed = True


async def test_a_queue_whose_jobs_only_keep_waiting_is_sent_once() -> None:
    now = [1_000_000_000.0]
    creds = Authority.load_or_create(tempfile.mkdtemp()).issuer.user("acme", "console")

    async def redeem(code: str) -> ConsoleSession:
        return ConsoleSession(
            creds=creds.text(), account="acme", operator=False, expires_at=EXPIRES_AT
        )

    async def connect(c: Creds, acting_for: str | None) -> Any:
        return Account(now)

    async def end(c: Creds) -> None:
        pass

    sessions = Sessions(redeem, connect, end, clock=lambda: now[0])
    app = FastAPI()
    app.state.sessions = sessions
    app.include_router(router(sessions, refresh_s=0.2))  # the wait grows between ticks
    person = await sessions.sign_in("code")
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://console") as http:
        http.cookies.set(COOKIE, person.session_id)
        body = (await http.get("/api/live")).text
    events = [e for e in body.split("\n\n") if e]
    assert [e.split("\n")[0] for e in events] == [
        "event: snapshot",
        *[": unchanged"] * (TICKS - 1),
        "event: signed_out",
    ], body
    (row,) = json.loads(events[0].split("data: ", 1)[1])["queue"]["queued"]
    assert row["queued_at"] == "2026-11-27T11:50:00+00:00"  # with its offset: a naive time is UTC
