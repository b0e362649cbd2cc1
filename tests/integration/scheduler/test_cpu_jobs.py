"""CPU-only jobs (R-JOB-2) through the running scheduler, on the real bus and database:
placed on the CPUs a node offers, a too-big one waiting with its reason, CPUs freed when a
worker finishes, is cancelled or its node is lost; the rate per CPU-hour."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from gpufleet_contracts.jobs import (
    CancelJob,
    PendingDemandChanged,
    StartWorker,
    WorkerFinished,
    WorkerPlaced,
)
from gpufleet_contracts.nodes import NodeState
from gpufleet_devstack import wait_for_async

from ..bus.test_bus import read_stream
from .test_fleet import Sys, known, registered, state_changed, system

__all__ = ["system"]  # the fixture, shared with test_fleet.py


def cpu_job(**kw: Any) -> dict[str, Any]:
    return {"gpu_types": None, "gpu_count": 0, **kw}


async def cpu_claims(s: Sys) -> list[str]:
    return sorted(
        c["_id"] for c in await s.sched.state.db.claims.find({"gpu_index": -1}).to_list(None)
    )


async def test_cpu_jobs_are_placed_on_offered_cpus_wait_with_a_reason_and_free_them(
    system: Sys,
) -> None:
    s = system
    gpu_only = registered("g", gpus=2)  # offers no CPUs to CPU-only jobs
    await s.node(gpu_only)
    await s.node(registered("c", gpus=2).model_copy(update={"cpu_count": 32, "cpu_job_cpus": 12}))
    await known(s, "g", "c")
    small = await s.submit("small", **cpu_job(cpu_count=8))
    assert small["state"] == "starting" and small["rate"] == "0.0125"  # per CPU-hour
    (w,) = small["workers"]
    assert (w["node"], w["cpu_count"], w["gpu_indices"], w["gpu_model"]) == ("c", 8, [], None)
    assert await cpu_claims(s) == [f"n-c:cpu:{k}" for k in range(8)]
    (start,) = await s.starts("c")
    assert (start.cpu_count, start.gpu_indices, start.gpu_fraction) == (8, [], None)
    placed = [
        WorkerPlaced.from_bytes(m.data) for m in await read_stream(s.server, WorkerPlaced.SUBJECT)
    ]
    assert [(p.cpu_count, p.gpu_count, p.gpu_model, str(p.rate)) for p in placed] == [
        (8, 0, "", "0.0125")
    ]

    # burstable: only such waiting work is demand the provisioner is told of (scheduler README)
    big = await s.submit("big", **cpu_job(cpu_count=8, allow_burst=True))
    assert big["state"] == "queued"
    assert big["queue_reason"] == (
        "1 node: busy (4 of 12 CPUs free, needs 8); 1 node: offers no CPUs to CPU-only jobs"
    )
    gpu = await s.submit("gpu", gpu_count=2)  # GPU work is not held up by CPU work
    assert gpu["state"] == "starting"

    async def demanded() -> bool:
        msgs = await read_stream(s.server, PendingDemandChanged.SUBJECT)
        last = PendingDemandChanged.from_bytes(msgs[-1].data) if msgs else None
        return last is not None and [(d.job_id, d.cpu_count) for d in last.demands] == [
            (big["id"], 8)
        ]

    await wait_for_async(demanded, timeout=10)

    # The small one finishes: its CPUs go to the waiting one.
    await s.worker(finish(start, "finished"))
    await s.until(small["id"], "finished")
    moved = await s.until(big["id"], "starting")
    assert moved["workers"][0]["node"] == "c" and moved["queue_reason"] is None
    assert await cpu_claims(s) == [f"n-c:cpu:{k}" for k in range(8)]

    # Cancelled: its CPUs are held until its node reports the stop, then go to the next.
    third = await s.submit("third", **cpu_job(cpu_count=8))
    assert third["state"] == "queued"
    await s.call(CancelJob.SUBJECT, CancelJob(job_id=big["id"]).to_bytes())
    assert await cpu_claims(s) == [f"n-c:cpu:{k}" for k in range(8)]
    big_start = next(x for x in await s.starts("c") if x.job_id == big["id"])
    await s.worker(finish(big_start, "stopped"))
    await s.until(big["id"], "stopped")
    assert (await s.until(third["id"], "starting"))["workers"][0]["node"] == "c"

    # Its node lost: the CPU work goes back to the queue and the CPUs are released.
    await s.node(state_changed("c", NodeState.lost))

    async def released() -> bool:
        return await cpu_claims(s) == []

    await wait_for_async(released, timeout=10)
    why = "1 node: lost, not active; 1 node: offers no CPUs to CPU-only jobs"

    async def explained() -> bool:
        return bool((await s.job(third["id"]))["queue_reason"] == why)

    await wait_for_async(explained, timeout=10)
    waiting = await s.job(third["id"])
    assert waiting["state"] == "queued" and waiting["workers"][0]["attempts"] == 1


def finish(start: StartWorker, state: str) -> WorkerFinished:
    return WorkerFinished(
        job_id=start.job_id,
        worker=start.worker,
        placement_id=start.placement_id,
        minion_id=start.minion_id,
        state=state,
        exit_code=0 if state == "finished" else None,
        ended_at=datetime.now(UTC),
    )


async def test_another_accounts_node_sells_cpus_at_its_price_within_max_price(
    system: Sys,
) -> None:
    s = system
    node = registered("p", owner="seller", public=True, price="1.00")
    await s.node(
        node.model_copy(update={"cpu_job_cpus": 16, "price_per_cpu_hour": Decimal("0.04")})
    )
    await known(s, "p")
    dear = await s.submit("dear", **cpu_job(cpu_count=4, max_price="0.03"))
    assert dear["queue_reason"] == "1 node: 0.04 > max price 0.03"
    ok = await s.submit("ok", **cpu_job(cpu_count=16, max_price="0.05"))
    assert ok["state"] == "starting" and ok["rate"] == "0.04"
    assert ok["workers"][0]["charge"] == "market"


async def test_a_cpu_job_pinned_to_a_region_without_offered_cpus_is_refused(
    system: Sys,
) -> None:
    s = system
    await s.node(registered("a", region="eu"))
    await s.node(registered("b", region="us").model_copy(update={"cpu_job_cpus": 8}))
    await known(s, "a", "b")
    reply = await s.submit("pinned", **cpu_job(cpu_count=4, region="eu"))
    assert reply["ok"] is False
    (field,) = reply["error"]["fields"]
    assert (field["field"], field["rule"]) == ("spec.region", "R-RES-1")
    assert field["valid"] == "a region of yours with node offering CPUs to CPU-only jobs: us"
