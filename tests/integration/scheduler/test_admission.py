"""How the leader stores submissions: in the placement pass that considers them, one
transaction for the job, its placement and their events; and nothing is lost when that
pass fails (services/scheduler/.../passes.py, `_pass`). No relay runs here, so each
transaction's events stay in the outbox to be read back."""

from __future__ import annotations

import asyncio
import hashlib
from datetime import UTC, datetime

import pytest
from gpufleet_contracts.errors import Refused
from gpufleet_contracts.jobs import (
    JobQueued,
    JobSpec,
    JobStateChanged,
    StartWorker,
    WorkerPlaced,
)
from gpufleet_devstack import EmbeddedMongo, wait_for_async
from gpufleet_scheduler import passes
from gpufleet_scheduler.leadership import Lease
from gpufleet_scheduler.scheduler import Scheduler
from gpufleet_scheduler.settings import SchedulerSettings
from gpufleet_store import Store
from gpufleet_store.store import OUTBOX, outbox_messages

from ..conftest import store_for
from .test_fleet import registered


def spec(name: str, gpus: int = 1) -> JobSpec:
    return JobSpec.model_validate(
        {"name": name, "gpu_types": ["RTX 3090"], "gpu_count": gpus, "command": ["true"]}
    )


async def transactions(store: Store) -> list[list[str]]:
    """The event types of each transaction, oldest first."""
    docs = await store.db[OUTBOX].find({}).sort([("created_at", 1), ("seq", 1)]).to_list(None)
    return [[type_ for _, _, type_, _ in outbox_messages(d)] for d in docs]


def clock() -> datetime:
    return datetime.now(UTC)


async def test_a_job_is_stored_once_with_its_placement(
    mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    store = store_for("scheduler", mongo_server.url, db_prefix)
    sched = Scheduler(store, clock)
    await sched.lifecycle.node_changed(registered("a", gpus=1))
    await store.db[OUTBOX].delete_many({})

    placed = await sched.admission.submit(spec("fits"), "local")
    waits = await sched.admission.submit(spec("too-big", gpus=4), "local")

    assert placed["state"] == "starting"
    assert [h["state"] for h in placed["history"]] == ["queued", "starting"]
    assert waits["state"] == "queued"
    assert waits["queue_reason"] and "not yet considered" not in waits["queue_reason"]
    stored = await store.db.jobs.find_one({"_id": waits["id"]})
    assert stored is not None and stored["queue_reason"] == waits["queue_reason"]
    # Each submission is one transaction: its JobQueued with what the pass did about it.
    txs = await transactions(store)
    # JobQueued is the job's first state: no JobStateChanged says "queued" again.
    assert txs[0] == [JobQueued.TYPE, WorkerPlaced.TYPE, StartWorker.TYPE, JobStateChanged.TYPE]
    assert txs[1] == [JobQueued.TYPE]
    await store.close()


@pytest.mark.parametrize("chunk", [500, 2])
async def test_submissions_are_kept_when_the_pass_is_fenced_off(
    mongo_server: EmbeddedMongo, db_prefix: str, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    """A leader deposed behind its back (its lease looks fresh to it) has its pass's
    transaction refused by the fence; the jobs it was storing are stored all the same,
    unplaced, for the new leader (chunk=2: a pass of several transactions stops at the
    first refused one)."""
    monkeypatch.setattr(passes, "COMMIT_CHUNK", chunk)
    store = store_for("scheduler", mongo_server.url, db_prefix)
    now = {"a": 1_000_000, "b": 1_000_000}
    a = Lease(store.db, ttl_ms=60_000, owner="a", now_ms=lambda: now["a"])
    b = Lease(store.db, ttl_ms=60_000, owner="b", now_ms=lambda: now["b"])
    sched = Scheduler(store, clock, lease=a)
    await sched.lifecycle.node_changed(registered("a", gpus=2))
    assert sched.state.loaded and a.fresh()
    assert not await b.acquire()  # b sees a's lease...
    now["b"] += 120_000  # ...unrenewed for two TTLs on b's clock (a is paused): b takes over
    assert await b.acquire()

    jobs = list(
        await asyncio.gather(*(sched.admission.submit(spec(f"j{i}"), "local") for i in range(5)))
    )

    assert [j["state"] for j in jobs] == ["queued"] * 5
    for j in jobs:
        stored = await store.db.jobs.find_one({"_id": j["id"]})
        assert stored is not None and stored["state"] == "queued"
    assert await store.db.claims.count_documents({}) == 0
    assert not sched.state.loaded  # it rebuilds its memory should it lead again
    await store.close()


async def test_every_waiting_job_is_explained_when_its_shapes_exceed_a_pass_budget(
    mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    """One shape explained a pass: the passes that follow explain the others on their own
    (nothing else asks for them), and the stored reasons say so."""
    store = store_for("scheduler", mongo_server.url, db_prefix)
    sched = Scheduler(store, clock, settings=SchedulerSettings(explain_budget=1))
    await sched.lifecycle.node_changed(registered("a", gpus=1))
    # Submitted at once: one pass takes all three and explains one of them.
    jobs = await asyncio.gather(
        *(sched.admission.submit(spec(f"big{n}", gpus=n), "local") for n in (2, 3, 4))
    )
    ids = [j["id"] for j in jobs]

    async def all_explained() -> bool:
        docs = await store.db.jobs.find({"_id": {"$in": ids}}).to_list(None)
        return all(d["queue_reason"] and "not yet" not in d["queue_reason"] for d in docs)

    await wait_for_async(all_explained, timeout=10)
    for job_id, n in zip(ids, (2, 3, 4), strict=True):
        shown = await sched.queries.get(job_id, "local")
        assert shown["queue_reason"] == f"1 node: has 1 GPUs, job needs {n}"
    await store.close()


async def test_a_pass_larger_than_a_chunk_commits_chunk_after_chunk(
    mongo_server: EmbeddedMongo, db_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks of two jobs: every job is stored once, placed, its events in its chunk's
    transaction."""
    monkeypatch.setattr(passes, "COMMIT_CHUNK", 2)
    store = store_for("scheduler", mongo_server.url, db_prefix)
    sched = Scheduler(store, clock)
    await sched.lifecycle.node_changed(registered("a", gpus=8))
    await store.db[OUTBOX].delete_many({})

    jobs = await asyncio.gather(*(sched.admission.submit(spec(f"j{i}"), "local") for i in range(7)))

    assert [j["state"] for j in jobs] == ["starting"] * 7
    assert await store.db.claims.count_documents({}) == 7
    txs = [t for t in await transactions(store) if JobQueued.TYPE in t]
    assert all(t.count(JobQueued.TYPE) <= 2 for t in txs) and len(txs) >= 4
    assert sum(t.count(WorkerPlaced.TYPE) for t in txs) == 7
    assert all(t.count(JobQueued.TYPE) == t.count(WorkerPlaced.TYPE) for t in txs)
    await store.close()


@pytest.mark.parametrize("first_leads", [True, False])
async def test_a_request_heard_by_two_instances_queues_one_job(
    mongo_server: EmbeddedMongo, db_prefix: str, monkeypatch: pytest.MonkeyPatch, first_leads: bool
) -> None:
    """A client that heard no answer asks again (SubmitJob with the same request id); the
    second ask reaches another instance, which stores the job while the first instance is
    still working on it. The first stores nothing more: both answer with the one job.
    (first_leads: the first instance's pass hits the stored job; else its unplaced store.)"""
    store = store_for("scheduler", mongo_server.url, db_prefix)
    leases = {n: Lease(store.db, ttl_ms=60_000, owner=n, now_ms=lambda: 1_000_000) for n in "abc"}
    assert await leases["a" if first_leads else "c"].acquire()
    first = Scheduler(store, clock, lease=leases["a"])
    other = Scheduler(store, clock, lease=leases["b"])  # never leads here
    await first.lifecycle.node_changed(registered("a", gpus=2))
    await store.db[OUTBOX].delete_many({})
    answers: list[dict[str, object]] = []
    resolve = first.admission.projects.resolve

    async def meanwhile(*args: object) -> tuple[str, str]:
        if not answers:  # the first instance has checked that no such job is stored yet
            answers.append(await other.admission.submit(spec("twice"), "acme", request_id="r1"))
        return await resolve(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(first.admission.projects, "resolve", meanwhile)
    late = await first.admission.submit(spec("twice"), "acme", request_id="r1")

    assert late["id"] == answers[0]["id"]
    assert await store.db.jobs.count_documents({}) == 1
    queued = [t for t in await transactions(store) for t in t if t == JobQueued.TYPE]
    assert queued == [JobQueued.TYPE]
    # The same request id from another account is another account's job.
    theirs = await other.admission.submit(spec("twice"), "other", request_id="r1")
    assert theirs["id"] != late["id"]
    # Ids are 48 bits of a hash: one of another account's jobs that a request id happens to
    # name is refused, never shown (R-TEN-2).
    collided = "j" + hashlib.sha256(b"acme\nr9").hexdigest()[:12]
    doc = await store.db.jobs.find_one({"_id": theirs["id"]})
    assert doc is not None
    await store.db.jobs.insert_one({**doc, "_id": collided})
    with pytest.raises(Refused) as refused:
        await first.admission.submit(spec("mine"), "acme", request_id="r9")
    assert refused.value.reply.error.code == "conflict"
    shown = refused.value.reply.model_dump_json()
    assert theirs["id"] not in shown and '"other"' not in shown and "twice" not in shown
    await store.close()
