"""A restarting leader rebuilds from its checkpoint plus what changed after it, and gets the
same memory as from every document (services/scheduler/.../checkpoint.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from gpufleet_bus import Ports
from gpufleet_contracts.jobs import WorkerFinished
from gpufleet_contracts.nodes import NodeState
from gpufleet_devstack import EmbeddedMongo, NatsServer, wait_for_async
from gpufleet_scheduler import checkpoint
from gpufleet_scheduler.app import build_app
from gpufleet_scheduler.scheduler import Scheduler
from gpufleet_scheduler.settings import SchedulerSettings
from gpufleet_store import utcnow

from ..conftest import broker_for, running, store_for
from .test_fleet import Sys, known, registered, state_changed


def picture(s: Scheduler) -> dict[str, Any]:
    """What placement depends on: open jobs and their workers, the nodes and their claims."""
    return {
        "jobs": {
            j: (d["state"], d["version"], [(w["state"], w.get("node_id")) for w in d["workers"]])
            for j, d in s.state.jobs.items()
        },
        "waiting": sorted(repr((w.req, w.queued_ms)) for w in s.state.waiting()),
        "nodes": {n: (v.state, v.free_indices, v.partial) for n, v in s.state.fleet.base.items()},
        "used": {
            n: {g: sorted(x) for g, x in u.items() if x} for n, u in s.state.fleet.used.items()
        },
    }


async def test_checkpoint_plus_later_changes_equals_a_full_load(
    fresh_nats: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    store = store_for("scheduler", mongo_server.url, db_prefix)
    built = build_app(
        Ports(broker_for("scheduler", fresh_nats), store), SchedulerSettings(starve_after_s=3600)
    )
    app, sched = built.app, built.core
    async with running(app):
        s = Sys(fresh_nats, sched)
        await s.node(registered("a", gpus=1))
        await s.node(registered("b", gpus=2, shares=2))
        await known(s, "a", "b")
        jobs = [await s.submit(f"j{i}") for i in range(4)]
        half = await s.submit("half", gpu_count=0.5)
        await sched.memory.write_checkpoint()
        at_checkpoint = sched.state.checkpointed_rev
        assert at_checkpoint > 0
        # After the checkpoint: a finished worker, a new job, a node to maintenance.
        start = (await s.starts("a"))[0]
        await s.worker(
            WorkerFinished(
                job_id=start.job_id,
                worker=0,
                placement_id=start.placement_id,
                minion_id="a",
                state="finished",
                exit_code=0,
                ended_at=datetime.now(UTC),
            )
        )
        await s.until(start.job_id, "finished")
        late = await s.submit("late")
        await s.node(state_changed("b", NodeState.maintenance))

        async def maintenance() -> bool:
            return bool(sched.state.fleet.base["n-b"].state == "maintenance")

        await wait_for_async(maintenance, timeout=10)
        await s.close()
        live = picture(sched)
        # Leave as a crash would: no checkpoint at stop.
        sched.state.loaded = False
    assert late["id"] in live["jobs"] and half["id"] in live["jobs"]
    assert start.job_id not in live["jobs"] and jobs[0]["id"] != late["id"]

    from_checkpoint = Scheduler(store, utcnow)
    await from_checkpoint.memory.load()
    assert from_checkpoint.state.loaded_from == f"checkpoint at rev {at_checkpoint}"
    assert from_checkpoint.state.rev >= sched.state.rev

    await store.db[checkpoint.COLLECTION].delete_many({})
    from_documents = Scheduler(store, utcnow)
    await from_documents.memory.load()
    assert from_documents.state.loaded_from == "documents"

    assert picture(from_checkpoint) == picture(from_documents) == live
    # A job known only from the checkpoint is placed from its whole document.
    assert any(j.get("partial") for j in from_checkpoint.state.jobs.values())
    await store.close()
