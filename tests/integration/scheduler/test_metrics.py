"""The scheduler's /metrics series from the leader's memory: a job placed, one queued."""

from __future__ import annotations

from gpufleet_devstack import EmbeddedMongo
from gpufleet_scheduler.metrics import SchedulerMetrics
from gpufleet_scheduler.scheduler import Scheduler

from ..conftest import store_for
from .test_admission import clock, spec
from .test_fleet import registered


async def test_queue_and_placements_by_region_and_account(
    mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    store = store_for("scheduler", mongo_server.url, db_prefix)
    sched = Scheduler(store, clock)
    metrics = SchedulerMetrics(sched)
    await sched.lifecycle.node_changed(registered("a", gpus=1))
    assert await sched.admission.submit(spec("fits"), "local")
    assert (await sched.admission.submit(spec("too-big", gpus=4), "local"))["state"] == "queued"
    out = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in await metrics.collect()
        for s in f.samples
    }
    assert out[("gpufleet_placements_total", (("region", "local"),))] == 1  # node a's
    assert out[("gpufleet_queue_jobs", (("account", "local"), ("region", "")))] == 1
    assert out[("gpufleet_queue_oldest_wait_seconds", (("account", "local"), ("region", "")))] >= 0
    await store.close()
