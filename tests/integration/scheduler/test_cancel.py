"""Cancelling a job in the scheduler, against the embedded database (R-TEN-2, R-JOB-8): only
its owner or creator may. Another account's cancel answers "not found" and changes nothing:
not the stored job (state, workers, version, cancel flag), not its claims on the node's GPUs,
not the outbox (no StopWorker, no JobStateChanged). No relay runs: events stay in the outbox
to be read back."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from gpufleet_contracts.errors import NotFound
from gpufleet_contracts.identity import Plan
from gpufleet_contracts.jobs import StopWorker
from gpufleet_devstack import EmbeddedMongo
from gpufleet_scheduler.app import INDEXES
from gpufleet_scheduler.scheduler import Scheduler
from gpufleet_store.store import OUTBOX, outbox_messages

from ..conftest import store_for
from .test_fleet import registered
from .test_projects import clock, plans, spec


@pytest.fixture
async def sched(mongo_server: EmbeddedMongo, db_prefix: str) -> Any:
    store = store_for("scheduler", mongo_server.url, db_prefix)
    await store.ensure_indexes(INDEXES)  # as the service does at start-up
    s = Scheduler(store, clock)
    await plans(s, acme=Plan.team, bob=Plan.team)
    yield s
    await store.close()


async def stored(sched: Scheduler, job_ids: list[str]) -> dict[str, Any]:
    """What a cancel could change: the jobs' documents, the claims, the outbox's events."""
    db = sched.state.db
    jobs = {j: await db.jobs.find_one({"_id": j}) for j in job_ids}
    claims = sorted(c["_id"] for c in await db.claims.find({}).to_list(None))
    events = Counter(
        (subject, type_)
        for doc in await sched.state.store.db[OUTBOX].find({}).to_list(None)
        for _, subject, type_, _ in outbox_messages(doc)
    )
    return {"jobs": jobs, "claims": claims, "events": events}


async def test_another_accounts_cancel_is_not_found_and_changes_nothing(
    sched: Scheduler,
) -> None:
    await sched.lifecycle.node_changed(registered("a", owner="acme", gpus=2))
    placed = await sched.admission.submit(spec("placed"), "acme")
    waiting = await sched.admission.submit(spec("waiting", gpu_count=2), "acme")  # 1 GPU left
    assert (placed["state"], waiting["state"]) == ("starting", "queued")
    ids = [placed["id"], waiting["id"]]
    before = await stored(sched, ids)
    assert before["claims"]  # the placed worker holds its GPU

    for outsider in ("bob", "zed"):  # an account with a plan, and one unknown
        for job_id in ids:
            with pytest.raises(NotFound) as refused:
                await sched.lifecycle.cancel(job_id, outsider)
            assert refused.value.code == "not_found"
            assert refused.value.message == f"job {job_id} not found"

    assert await stored(sched, ids) == before
    assert (await sched.queries.get(placed["id"], "acme"))["state"] == "starting"
    assert (await sched.queries.get(waiting["id"], "acme"))["state"] == "queued"


async def test_its_owners_cancel_is_seen_by_the_same_checks(sched: Scheduler) -> None:
    """The control of the test above: what it compares does change when a cancel happens."""
    await sched.lifecycle.node_changed(registered("b", owner="acme", gpus=1))
    placed = await sched.admission.submit(spec("placed"), "acme")
    assert placed["state"] == "starting"
    before = await stored(sched, [placed["id"]])

    await sched.lifecycle.cancel(placed["id"], "acme")

    after = await stored(sched, [placed["id"]])
    assert after["jobs"][placed["id"]]["cancel_requested"] is True
    assert after["jobs"] != before["jobs"]
    new = after["events"] - before["events"]
    assert {t for _, t in new} == {StopWorker.TYPE}  # the job stops once its worker has
