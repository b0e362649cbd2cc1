"""Jobs submitted as an event by another system: same validation, idempotent, answered
by events (JobQueued with the request id, JobRejected, or a dead letter)."""

from __future__ import annotations

import json
from typing import Any

import nats
import pytest
from gpufleet_contracts import Envelope, subjects
from gpufleet_contracts.jobs import EnqueueJob, JobQueued, JobRejected, JobSpec
from gpufleet_devstack import NatsServer, wait_for_async

from ..bus.test_bus import read_stream
from ..conftest import connect
from ..test_job_flow import system  # noqa: F401  (the in-process scheduler and billing)

SPEC = {"name": "from-ci", "gpu_types": ["RTX 3090"], "max_price": "1.0", "command": ["true"]}


async def enqueue(server: NatsServer, body: bytes, account: str = "local") -> None:
    """Publish as another system would: JetStream, CloudEvents headers, with a credential of
    its account, on that account's subject (the only one the credential may publish)."""
    subject = EnqueueJob.subject_for(account)
    env = Envelope(type=EnqueueJob.TYPE, source="ci-system", subject=subject)
    nc = await connect(server, server.creds("user", "ci-system", account=account))
    try:
        await nc.jetstream().publish(subject, body, headers=env.headers())
    finally:
        await nc.close()


async def jobs(client: Any) -> list[dict[str, Any]]:
    return list((await client.call(subjects.rpc("scheduler", "list_jobs"), b"{}"))["jobs"])


async def test_an_event_queues_one_job_however_often_it_is_delivered(system: Any) -> None:  # noqa: F811
    client, _, server = system
    cmd = EnqueueJob(request_id="build-42", spec=JobSpec.model_validate(SPEC))
    for _ in range(3):  # re-sent under new message ids: still one job
        await enqueue(server, cmd.to_bytes())

    async def queued_event() -> bool:
        msgs = await read_stream(server, JobQueued.SUBJECT)
        return any(JobQueued.from_bytes(m.data).request_id == "build-42" for m in msgs)

    await wait_for_async(queued_event, timeout=15)
    await wait_for_async(lambda: _count(client, "from-ci", 1), timeout=10)
    (job,) = [j for j in await jobs(client) if j["name"] == "from-ci"]
    assert job["owner"] == "local"
    placed = await client.job(job["id"])
    assert placed["state"] in ("starting", "running")  # it went on to a GPU by itself
    events = [JobQueued.from_bytes(m.data) for m in await read_stream(server, JobQueued.SUBJECT)]
    assert [e.job_id for e in events if e.request_id == "build-42"] == [job["id"]]


async def _count(client: Any, name: str, n: int) -> bool:
    return len([j for j in await jobs(client) if j["name"] == name]) == n


async def test_an_invalid_event_is_dead_lettered_with_its_rules_and_queues_nothing(
    system: Any,  # noqa: F811
) -> None:
    client, _, server = system
    bad = {"request_id": "build-43", "spec": {**SPEC, "disk_size_gb": 5, "gpu_types": ["X"]}}
    await enqueue(server, json.dumps(bad).encode())

    async def dead_lettered() -> list[dict[str, Any]]:
        return [
            json.loads(m.data)
            for m in await read_stream(server, subjects.dead_letter("scheduler", "*"))
        ]

    await wait_for_async(lambda: _nonempty(dead_lettered), timeout=15)
    (record,) = await dead_lettered()
    assert record["reason"] == "invalid"
    fields = {e["field"]: e["rule"] for e in record["errors"]}
    assert fields == {"spec.disk_size_gb": "R-JOB-2", "spec.gpu_types": "R-JOB-2"}
    assert record["headers"]["ce-source"] == "ci-system"
    assert [j for j in await jobs(client) if j["name"] == "from-ci"] == []


async def _nonempty(fn: Any) -> bool:
    return bool(await fn())


async def test_a_pin_to_a_region_without_the_gpu_type_is_rejected_by_event(
    system: Any,  # noqa: F811
) -> None:
    client, _, server = system
    spec = JobSpec.model_validate({**SPEC, "gpu_types": ["T4"], "region": "local"})
    await enqueue(server, EnqueueJob(request_id="build-44", spec=spec).to_bytes())

    async def rejected() -> list[JobRejected]:
        return [
            JobRejected.from_bytes(m.data) for m in await read_stream(server, JobRejected.SUBJECT)
        ]

    await wait_for_async(lambda: _nonempty(rejected), timeout=15)
    (event,) = await rejected()
    assert event.request_id == "build-44" and event.account == "local"
    assert [(f.field, f.rule) for f in event.error.fields] == [("spec.region", "R-RES-1")]
    assert await jobs(client) == []


async def test_a_credential_cannot_enqueue_for_another_account(system: Any) -> None:  # noqa: F811
    _, _, server = system
    cmd = EnqueueJob(request_id="build-45", spec=JobSpec.model_validate(SPEC))
    nc = await connect(server, server.creds("user", "ci-system", account="local"))
    try:
        with pytest.raises(nats.errors.TimeoutError):  # the server drops it: no stream ack
            await nc.jetstream().publish(EnqueueJob.subject_for("other"), cmd.to_bytes(), timeout=1)
    finally:
        await nc.close()
    assert await read_stream(server, EnqueueJob.subject_for("other")) == []
