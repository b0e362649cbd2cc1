"""A job's path through provisioner, scheduler and billing over the real bus and database.

The node agent's side (StartWorker in, WorkerStarted/WorkerFinished out) is played by the test,
so each service's behaviour, including duplicates, is checked exactly.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from gpufleet_billing.app import build_app as billing_app
from gpufleet_bus import Ports, publish
from gpufleet_contracts import subjects
from gpufleet_contracts.jobs import (
    CancelJob,
    GetJob,
    JobSpec,
    StartWorker,
    StopWorker,
    SubmitJob,
    WorkerFinished,
    WorkerStarted,
    WorkerState,
)
from gpufleet_contracts.nodes import GpuInfo, NodeRegistered, NodeState
from gpufleet_devstack import EmbeddedMongo, NatsServer, wait_for_async
from gpufleet_scheduler.app import build_app as scheduler_app

from .bus.test_bus import read_stream
from .conftest import AccountClient, as_identity, as_user, broker_for, connect, running, store_for

MINION = "m1"


def register(gpus: int = 2) -> NodeRegistered:
    """The provisioner's event for an active node (the scheduler's input; the provisioner's
    own admission rules are tested with the provisioner)."""
    return NodeRegistered(
        node_id="n-" + MINION,
        minion_id=MINION,
        name=MINION,
        region="local",
        owner="local",
        state=NodeState.active,
        at=datetime.now(UTC),
        gpus=[
            GpuInfo(
                index=i,
                uuid=f"GPU-{i}",
                model="RTX 3090",
                nvml_name="NVIDIA GeForce RTX 3090",
                memory_mb=24576,
            )
            for i in range(gpus)
        ],
        simulated=True,
    )


class Client(AccountClient):
    """A user of account `local`: requests on `<subject>.local`, with its credential."""

    async def submit(self, name: str, **kw: Any) -> dict[str, Any]:
        spec = JobSpec.model_validate(
            {"name": name, "gpu_types": ["RTX 3090"], "max_price": "1.0", "command": ["true"], **kw}
        )
        return await self.call(SubmitJob.SUBJECT, SubmitJob(spec=spec).to_bytes())

    async def job(self, job_id: str) -> dict[str, Any]:
        return await self.call(GetJob.SUBJECT, GetJob(job_id=job_id).to_bytes())


@pytest.fixture
async def system(fresh_nats: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str) -> Any:
    """The scheduler and billing; yields a user of `local`, the node agent of MINION (its
    own credential: the events only it may publish) and the server."""
    built = scheduler_app(
        Ports(
            broker_for("scheduler", fresh_nats),
            store_for("scheduler", mongo_server.url, db_prefix),
        )
    )
    scheduler = built.core
    billing = billing_app(
        Ports(broker_for("billing", fresh_nats), store_for("billing", mongo_server.url, db_prefix))
    )
    apps = [built.app, billing.app]
    async with running(*apps), as_identity(fresh_nats, "node", MINION) as node:
        async with as_identity(fresh_nats, "service", "provisioner") as provisioner:
            await publish(provisioner, register(), source="test")
        client = Client(
            await connect(fresh_nats, fresh_nats.creds("user", account="local")), "local"
        )

        async def node_known() -> bool:
            return await scheduler.state.db.nodes.find_one({"minion_id": MINION}) is not None

        await wait_for_async(node_known, timeout=10)
        yield client, node, fresh_nats
        await client.nc.close()


async def start_commands(server: NatsServer) -> list[StartWorker]:
    msgs = await read_stream(server, StartWorker.SUBJECT.format(minion_id=MINION))
    return [StartWorker.from_bytes(m.data) for m in msgs]


async def test_jobs_fill_the_gpus_queue_with_a_reason_and_start_when_one_frees(
    system: Any,
) -> None:
    client, node, server = system
    a = await client.submit("a")
    b = await client.submit("b")

    async def two_placed() -> bool:
        states = [(await client.job(j["id"]))["state"] for j in (a, b)]
        return states == ["starting", "starting"]

    await wait_for_async(two_placed, timeout=10)
    c = await client.submit("c")
    assert c["state"] == "queued"
    assert c["queue_reason"] == "1 node: busy (0 of 2 GPUs free, needs 1)"

    starts = await start_commands(server)
    assert sorted(s.gpu_indices[0] for s in starts) == [0, 1]  # no GPU given twice
    first = next(s for s in starts if s.job_id == a["id"])

    # A run the scheduler can believe: started after its placement, reported after it ended
    # (the node's times are clamped to [placed, received], so no start 100 s before placing).
    t0 = datetime.now(UTC)
    started = WorkerStarted(
        job_id=first.job_id,
        worker=0,
        placement_id=first.placement_id,
        minion_id=MINION,
        started_at=t0,
    )
    finished = WorkerFinished(
        job_id=first.job_id,
        worker=0,
        placement_id=first.placement_id,
        minion_id=MINION,
        state=WorkerState.finished,
        exit_code=0,
        started_at=t0,
        ended_at=t0 + timedelta(seconds=1.5),
    )
    await asyncio.sleep(2)  # the run is over before it is reported
    # In the order the node publishes them, each delivered twice (at least once): the
    # scheduler's one consumer of the worker stream sees them in stream order.
    for evt in (started, started, finished, finished):
        await publish(node, evt, source="test")

    async def c_started() -> bool:
        return (await client.job(c["id"]))["state"] == "starting"

    await wait_for_async(c_started, timeout=10)
    job_a = await client.job(a["id"])
    assert job_a["state"] == "finished"
    assert [h["state"] for h in job_a["history"]] == ["queued", "starting", "running", "finished"]
    assert job_a["workers"][0]["run_seconds"] == 1.5
    assert job_a["rate"] == "0.05"  # R-BILL-1 development class, locked at placement

    cost_subject = subjects.rpc("billing", "job_cost")

    async def charged() -> bool:
        cost = await client.call(cost_subject, json.dumps({"job_id": a["id"]}).encode())
        return bool(cost["cost_micro"])

    await wait_for_async(charged, timeout=10)
    cost = await client.call(cost_subject, json.dumps({"job_id": a["id"]}).encode())
    # 1 GPU x 1.5 s x 0.05 credits/GPU-hour = 0.0000208 (21 micro-credits), charged once
    # despite duplicates.
    assert cost["cost"] == "0.000021"
    balance = await client.call(subjects.rpc("billing", "balance"), b"{}")
    assert balance["balance_micro"] == -21 and balance["entries"] == 1


async def test_cancel_stops_running_workers_and_waiting_ones(system: Any) -> None:
    client, node, server = system
    a = await client.submit("a", gpu_count=2)
    b = await client.submit("b", gpu_count=2)
    assert b["state"] == "queued"
    stopped_b = await client.call(CancelJob.SUBJECT, CancelJob(job_id=b["id"]).to_bytes())
    assert stopped_b["state"] == "stopped"  # it never held GPUs

    await client.call(CancelJob.SUBJECT, CancelJob(job_id=a["id"]).to_bytes())
    stops = await read_stream(server, StopWorker.SUBJECT.format(minion_id=MINION))
    assert [StopWorker.from_bytes(m.data).job_id for m in stops] == [a["id"]]
    start = (await start_commands(server))[0]
    await publish(
        node,
        WorkerFinished(
            job_id=a["id"],
            worker=0,
            placement_id=start.placement_id,
            minion_id=MINION,
            state=WorkerState.stopped,
            reason="stopped by request",
            ended_at=datetime.now(UTC),
        ),
        source="test",
    )

    async def a_stopped() -> bool:
        return (await client.job(a["id"]))["state"] == "stopped"

    await wait_for_async(a_stopped, timeout=10)


async def test_other_accounts_jobs_are_not_found(system: Any) -> None:
    client, _, server = system
    a = await client.submit("mine")
    async with as_user(server, "someone-else") as other:
        body = await other.call(GetJob.SUBJECT, GetJob(job_id=a["id"]).to_bytes())
    assert body["ok"] is False and body["error"]["code"] == "not_found"


async def test_invalid_submission_stores_nothing(system: Any) -> None:
    client, _, _ = system
    bad = {
        "spec": {
            "name": "x",
            "gpu_types": ["RTX 9999"],
            "max_price": "-1",
            "disk_size_gb": 5,
            "command": ["true"],
        }
    }
    reply = await client.call(SubmitJob.SUBJECT, json.dumps(bad).encode())
    fields = {f["field"]: f["rule"] for f in reply["error"]["fields"]}
    assert fields == {
        "spec.gpu_types": "R-JOB-2",
        "spec.max_price": "R-JOB-2",
        "spec.disk_size_gb": "R-JOB-2",
    }
    jobs = await client.call(subjects.rpc("scheduler", "list_jobs"), b"{}")
    assert jobs["jobs"] == []
