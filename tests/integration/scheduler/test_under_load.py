"""The scheduler's lifecycle at fleet speed (issue 15), against the real bus and database:
the last word of a stopping leader, a requeued worker's old placement fenced off, worker
reports handled in batches, burstable demand told only when it changed."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest
from gpufleet_bus import Ports, publish
from gpufleet_contracts.jobs import PendingDemandChanged, StopWorker, WorkerFinished, WorkerStarted
from gpufleet_contracts.nodes import NodeState
from gpufleet_devstack import EmbeddedMongo, NatsServer, wait_for_async
from gpufleet_scheduler.app import build_app
from gpufleet_scheduler.settings import SchedulerSettings

from ..bus.test_bus import read_stream
from ..conftest import as_identity, broker_for, running, store_for
from .test_fleet import Sys, known, registered, state_changed


@pytest.fixture
async def made(fresh_nats: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str) -> Any:
    built = build_app(
        Ports(
            broker_for("scheduler", fresh_nats), store_for("scheduler", mongo_server.url, db_prefix)
        ),
        SchedulerSettings(starve_after_s=3600),
    )
    async with running(built.app):
        s = Sys(fresh_nats, built.core)
        yield s
        await s.close()


async def test_a_stopping_scheduler_places_nothing_after_its_final_checkpoint(made: Sys) -> None:
    s = made
    st = s.sched.state
    await s.node(registered("a", gpus=1))
    await known(s, "a")
    first = await s.submit("first")
    await s.until(first["id"], "starting")
    second = await s.submit("second")
    assert second["state"] == "queued"
    [start] = await s.starts("a")
    # The runtime's shutdown hook; the broker still consumes meanwhile (FastStream stops it
    # after the hooks), so a worker's end can still arrive and free a GPU.
    await s.sched.stop()
    lease = await st.db.leases.find_one({"_id": "scheduler"})
    assert lease is not None and bool(lease["released"])
    checkpoints = await st.db.checkpoints.count_documents({})
    await s.worker(
        WorkerFinished(
            job_id=first["id"],
            worker=0,
            placement_id=start.placement_id,
            minion_id="a",
            state="finished",
            exit_code=0,
            ended_at=datetime.now(UTC),
        )
    )
    await s.until(first["id"], "finished")
    await s.sched.passes.request_pass()  # what a pass asked for now would have done
    assert (await s.job(second["id"]))["state"] == "queued"
    assert await s.starts("a") == [start]
    lease = await st.db.leases.find_one({"_id": "scheduler"})
    assert lease is not None and bool(lease["released"])  # not taken back
    assert await st.db.checkpoints.count_documents({}) == checkpoints


async def test_only_burstable_demand_is_told_and_only_when_it_changes(made: Sys) -> None:
    s = made
    await s.node(registered("a", gpus=1))
    await known(s, "a")
    for i in range(5):  # nothing of this can burst: no PendingDemandChanged at all
        await s.submit(f"local-{i}")
    burst = await s.submit("burst", gpu_types=["H100 80GB"], allow_burst=True)

    async def told() -> list[PendingDemandChanged]:
        msgs = await read_stream(s.server, PendingDemandChanged.SUBJECT)
        return [PendingDemandChanged.from_bytes(m.data) for m in msgs]

    async def burst_told() -> bool:
        return any(d.job_id == burst["id"] for e in await told() for d in e.demands)

    await wait_for_async(burst_told, timeout=10)
    for i in range(5):  # more that cannot burst: the demand is the same, nothing more told
        await s.submit(f"more-{i}")
    await s.sched.passes.request_pass()
    events = await told()
    assert len(events) == 1
    assert [(d.job_id, d.burst_allowed) for d in events[0].demands] == [(burst["id"], True)]
    assert events[0].waiting is not None and events[0].waiting >= 5


async def test_a_requeued_workers_old_placement_is_void(made: Sys) -> None:
    """Node `a` is declared lost while its worker runs; the worker is requeued onto `b`. The
    old run is told to stop, and `a`, alive after all, reporting it late changes nothing:
    the job is the new placement's (billing ignores it too: tests/integration/billing)."""
    s = made
    await s.node(registered("a", gpus=1))
    await known(s, "a")
    job = await s.submit("train")
    await s.until(job["id"], "starting")
    [old] = await s.starts("a")
    await s.worker(started(job["id"], old.placement_id, "a"))
    await s.until(job["id"], "running")
    await s.node(registered("b", gpus=1))
    await known(s, "b")
    await s.node(state_changed("a", NodeState.lost))

    async def moved() -> bool:
        return bool((await s.job(job["id"]))["workers"][0]["node"] == "b")

    await wait_for_async(moved, timeout=10)
    [new] = await s.starts("b")
    stops = [
        StopWorker.from_bytes(m.data)
        for m in await read_stream(s.server, StopWorker.SUBJECT.format(minion_id="a"))
    ]
    assert [x.placement_id for x in stops] == [old.placement_id]
    # `a` reports the old run: a (repeated) start and its end; then `b` starts the new one.
    await s.worker(started(job["id"], old.placement_id, "a"))
    await s.worker(ended(job["id"], old.placement_id, "a"))
    await s.worker(started(job["id"], new.placement_id, "b"))
    shown = await s.until(job["id"], "running")
    w = shown["workers"][0]
    assert w["node"] == "b" and w["state"] == "running" and w["attempts"] == 1


async def test_reports_in_one_batch_record_every_state_a_job_went_through(made: Sys) -> None:
    s = made
    await s.node(registered("a", gpus=8))
    await known(s, "a")
    jobs = [await s.submit(f"j{i}") for i in range(8)]
    for j in jobs:
        await s.until(j["id"], "starting")
    starts = {x.job_id: x for x in await s.starts("a")}
    batches = s.sched.reports.batches
    # While the scheduler is held (a pass under way), all 16 reports are stored: the first
    # fetch waits for it, the next one takes every report left.
    async with as_identity(s.server, "node", "a") as agent, s.sched.state.lock:
        for j in jobs:
            placement = starts[j["id"]].placement_id
            await publish(agent, started(j["id"], placement, "a"), source="test")
            await publish(agent, ended(j["id"], placement, "a"), source="test")
    for j in jobs:
        done = await s.until(j["id"], "finished")
        assert [h["state"] for h in done["history"]][-3:] == ["starting", "running", "finished"]
    assert s.sched.reports.batches - batches <= 2
    again = await s.submit("after")  # the 8 GPUs are free again
    await s.until(again["id"], "starting")


def started(job_id: str, placement_id: str, minion: str) -> WorkerStarted:
    return WorkerStarted(
        job_id=job_id,
        worker=0,
        placement_id=placement_id,
        minion_id=minion,
        started_at=datetime.now(UTC),
    )


def ended(job_id: str, placement_id: str, minion: str) -> WorkerFinished:
    return WorkerFinished(
        job_id=job_id,
        worker=0,
        placement_id=placement_id,
        minion_id=minion,
        state="finished",
        exit_code=0,
        ended_at=datetime.now(UTC),
    )


async def test_under_a_burst_of_submissions_every_waiting_job_is_queued_with_its_reason(
    made: Sys,
) -> None:
    s = made
    await s.node(registered("a", gpus=8))
    await known(s, "a")
    replies = await asyncio.gather(*(s.submit(f"j{i}") for i in range(200)))
    jobs = [await s.job(r["id"]) for r in replies]
    starting = [j for j in jobs if j["state"] == "starting"]
    queued = [j for j in jobs if j["state"] == "queued"]
    assert len(starting) == 8 and len(queued) == 192
    assert all(j["queue_reason"] == "1 node: busy (0 of 8 GPUs free, needs 1)" for j in queued)
