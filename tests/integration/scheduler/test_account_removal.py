"""A removed account's jobs in the scheduler, over the real bus and database (R-TEN-1):
`AccountRemoved` (on JetStream, as the provisioner publishes it) cancels every open job the
account owns or created as `cancel_job` does (its waiting workers stopped, its placed one
told to stop, `JobStateChanged` with the reason "account removed"), leaves other accounts'
jobs alone, and no job is admitted for it afterwards; the same event delivered again
changes nothing (no event, no command, no write)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from gpufleet_bus import BusSettings, Ports, make_broker
from gpufleet_contracts import Message, subjects
from gpufleet_contracts.base import envelope_for
from gpufleet_contracts.errors import Refused
from gpufleet_contracts.identity import AccountRemoved, Plan
from gpufleet_contracts.jobs import EnqueueJob, JobStateChanged, StopWorker
from gpufleet_devstack import EmbeddedMongo, NatsServer, wait_for_async
from gpufleet_scheduler.app import build_app
from gpufleet_scheduler.scheduler import Scheduler
from nats.aio.client import Client

from ..conftest import admin_connect, running, store_for
from .test_fleet import registered
from .test_projects import plans, spec

EVENTS = subjects.STREAM_EVENTS
DURABLE = "scheduler-account-removed"


async def deliver(nc: Client, msg: Message) -> int:
    """`msg` on JetStream as a service publishes it (a fresh message id each time: what a
    redelivery hands the consumer again); its stream sequence."""
    env = envelope_for(msg, source="test", id=uuid.uuid4().hex)
    ack = await nc.jetstream().publish(msg.subject(), msg.to_bytes(), headers=env.headers())
    return int(ack.seq)


async def handled(nc: Client, stream: str, durable: str, seq: int) -> None:
    """The consumer `durable` has acked stream sequence `seq` (its handler returned)."""

    async def acked() -> bool:
        info = await nc.jetstream().consumer_info(stream, durable)
        return int(info.ack_floor.stream_seq or 0) >= seq

    await wait_for_async(acked, timeout=20, interval=0.1, message=f"{durable} never acked {seq}")


@pytest.fixture
async def bus(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str
) -> AsyncIterator[tuple[Scheduler, Client, list[tuple[str, dict[str, Any]]]]]:
    store = store_for("scheduler", mongo_server.url, db_prefix)
    settings = BusSettings(
        nats_url=nats_server.url, nats_creds=nats_server.creds("service", "scheduler")
    )
    built = build_app(Ports(make_broker("scheduler", settings), store, bus=settings))
    seen: list[tuple[str, dict[str, Any]]] = []
    nc = await admin_connect(nats_server)

    async def on_msg(msg: Any) -> None:
        seen.append((msg.subject, json.loads(msg.data)))

    await nc.subscribe(JobStateChanged.SUBJECT, cb=on_msg)
    await nc.subscribe(subjects.wildcard(StopWorker.SUBJECT), cb=on_msg)
    try:
        async with running(built.app):
            yield built.core, nc, seen
    finally:
        await nc.close()
        await store.close()


async def test_a_removed_accounts_jobs_are_cancelled_once_and_none_admitted_after(
    bus: tuple[Scheduler, Client, list[tuple[str, dict[str, Any]]]], db_prefix: str
) -> None:
    sched, nc, seen = bus
    gone, other = f"gone-{db_prefix}", f"other-{db_prefix}"
    await plans(sched, **{gone: Plan.team, other: Plan.team})
    minion = f"rm-{uuid.uuid4().hex[:6]}"
    await sched.lifecycle.node_changed(registered(minion, owner=gone, gpus=1))
    placed = await sched.admission.submit(spec("placed"), gone)
    waiting = await sched.admission.submit(spec("waiting"), gone)  # its one GPU is taken
    theirs = await sched.admission.submit(spec("theirs"), other)
    assert (placed["state"], waiting["state"], theirs["state"]) == ("starting", "queued", "queued")

    seq = await deliver(nc, AccountRemoved(account=gone, at=datetime.now(UTC)))
    await handled(nc, EVENTS, DURABLE, seq)

    db = sched.state.db
    jobs = {j["_id"]: j async for j in db.jobs.find({"owner": {"$in": [gone, other]}})}
    done = jobs[waiting["id"]]
    assert (done["state"], done["cancel_requested"]) == ("stopped", True)
    assert done["workers"][0]["reason"] == "account removed"
    stopping = jobs[placed["id"]]
    assert (stopping["state"], stopping["cancel_requested"]) == ("starting", True)
    assert not jobs[theirs["id"]]["cancel_requested"]  # another account's job goes on

    async def told() -> bool:
        return any(s.endswith(".stop_worker") for s, _ in seen) and any(
            b.get("job_id") == waiting["id"] for s, b in seen if s == JobStateChanged.SUBJECT
        )

    await wait_for_async(told, timeout=10)
    [(subject, stop)] = [(s, b) for s, b in seen if s.endswith(".stop_worker")]
    assert subject == StopWorker.SUBJECT.format(minion_id=minion)
    assert (stop["job_id"], stop["reason"]) == (placed["id"], "account removed")
    [changed] = [
        b for s, b in seen if s == JobStateChanged.SUBJECT and b["job_id"] == waiting["id"]
    ]
    assert (changed["state"], changed["reason"]) == ("stopped", "account removed")

    # the same event again (a redelivery): nothing is written, published or commanded
    versions = {d["_id"]: d["version"] async for d in db.jobs.find({"_id": {"$in": list(jobs)}})}
    before = len(seen)
    seq = await deliver(nc, AccountRemoved(account=gone, at=datetime.now(UTC)))
    await handled(nc, EVENTS, DURABLE, seq)
    await asyncio.sleep(0.5)  # what it would have published has had time to arrive
    assert len(seen) == before, seen[before:]
    after = {d["_id"]: d["version"] async for d in db.jobs.find({"_id": {"$in": list(jobs)}})}
    assert after == versions

    # nothing is admitted for it: its own submission, nor an EnqueueJob read after it
    with pytest.raises(Refused) as refused:
        await sched.admission.submit(spec("late"), gone)
    assert refused.value.code == "not_found"
    late = EnqueueJob(spec=spec("queued-before"), request_id="r-late")
    assert (rejected := await sched.enqueue(late, gone)) is not None
    assert rejected.error.code == "not_found"
    assert await db.jobs.count_documents({"owner": gone}) == 2
