"""An endpoint in the scheduler over the real bus and database (R-JOB-6): its worker's
StartWorker says how it serves, the job shows its URL on its node's proxy, its account
creates, lists and revokes its keys, the node that serves it asks whether a key opens it,
and what that node says of it (ready, metered) is shown on the job."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from gpufleet_bus import publish
from gpufleet_contracts import subjects
from gpufleet_contracts.jobs import JobSpec, SubmitJob
from gpufleet_contracts.serving import (
    ColdStartPhase,
    CreateEndpointKey,
    EndpointMetered,
    EndpointReady,
    ListEndpointKeys,
    PhaseAt,
    RevokeEndpointKey,
    ServingKind,
    VerifyEndpointKey,
    key_digest,
    parse_key,
)
from gpufleet_devstack import NatsServer, wait_for_async

from ..conftest import as_identity, connect
from .test_fleet import Sys, known, registered
from .test_fleet import system as system  # the fixture

PROXY = "http://{job}.a.localhost:8480"
SERVER = ["python3", "-m", "http.server", "80"]


def endpoint_spec(name: str = "ep", **endpoint: Any) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": name,
            "type": "endpoint",
            "gpu_types": ["RTX 3090"],
            "endpoint": endpoint or {"server_command": SERVER, "health_path": "/healthz"},
        }
    )


async def served_endpoint(s: Sys) -> tuple[dict[str, Any], str]:
    """A manual-server endpoint placed on node `a` (whose proxy serves `PROXY`): (the job
    as its account sees it, its placement)."""
    await s.node(registered("a", gpus=1).model_copy(update={"proxy_url": PROXY}))
    await s.node(registered("b", gpus=1))
    await known(s, "a", "b")
    accepted = await s.call(SubmitJob.SUBJECT, SubmitJob(spec=endpoint_spec()).to_bytes())
    job_id = accepted["id"]

    async def started() -> bool:
        return any(w.job_id == job_id for w in await s.starts("a"))

    await wait_for_async(started, timeout=10)
    (start,) = [w for w in await s.starts("a") if w.job_id == job_id]
    assert start.serving is not None
    assert (start.serving.kind, start.serving.health_path) == (ServingKind.server, "/healthz")
    assert start.command == SERVER
    return await s.job(job_id), start.placement_id


async def node_asks(server: NatsServer, minion: str, body: VerifyEndpointKey) -> dict[str, Any]:
    """The node `minion`'s question, on its own subject, answered to its own inbox."""
    nc = await connect(server, server.creds("node", minion))
    try:
        subject = subjects.as_node(VerifyEndpointKey.SUBJECT, minion)
        reply = await nc.request(subject, body.to_bytes(), timeout=10)
        answer: dict[str, Any] = json.loads(reply.data)
        return answer
    finally:
        await nc.close()


def verify(job_id: str, key: str) -> VerifyEndpointKey:
    parsed = parse_key(key)
    assert parsed is not None
    key_id, secret = parsed
    return VerifyEndpointKey(job_id=job_id, key_id=key_id, digest=key_digest(secret))


async def test_an_endpoints_url_keys_and_what_its_node_says_of_it(system: Sys) -> None:
    s = system
    job, placement = await served_endpoint(s)
    job_id = job["id"]
    assert job["url"] == f"http://{job_id}.a.localhost:8480"
    assert job["workers"][0]["url"] == job["url"] and job["requests"] is None

    # keys: created (the key once), listed without it, revoked (twice: the same answer)
    made = await s.call(
        CreateEndpointKey.SUBJECT, json.dumps({"job_id": job_id, "name": "ci"}).encode()
    )
    key, key_id = made["key"], made["view"]["key_id"]
    assert parse_key(key) is not None and key.startswith(f"gfk_{key_id}_")
    other = await s.call(CreateEndpointKey.SUBJECT, json.dumps({"job_id": job_id}).encode())
    listed = await s.call(ListEndpointKeys.SUBJECT, json.dumps({"job_id": job_id}).encode())
    assert [k["key_id"] for k in listed["keys"]] == [key_id, other["view"]["key_id"]]
    assert (parse_key(key) or ("", "-"))[1] not in json.dumps(listed)

    # the serving node asks: this key opens it; a key of another endpoint is `elsewhere`
    opened = await node_asks(s.server, "a", verify(job_id, key))
    assert opened.get("verdict") == "open", opened
    wrong = key[:-1] + ("A" if key[-1] != "A" else "B")
    assert (await node_asks(s.server, "a", verify(job_id, wrong)))["verdict"] == "unknown"
    second = await s.call(SubmitJob.SUBJECT, SubmitJob(spec=endpoint_spec("ep2")).to_bytes())

    async def on_b() -> bool:
        return any(w.job_id == second["id"] for w in await s.starts("b"))

    await wait_for_async(on_b, timeout=10)
    assert (await node_asks(s.server, "b", verify(second["id"], key)))["verdict"] == "elsewhere"
    # a node that serves no worker of the job is told nothing of its keys
    refused = await node_asks(s.server, "b", verify(job_id, key))
    assert refused["error"]["code"] == "not_found"
    assert (await s.job(second["id"]))["url"] is None  # node b has no proxy

    revoke = json.dumps({"job_id": job_id, "key_id": key_id}).encode()
    gone = await s.call(RevokeEndpointKey.SUBJECT, revoke)
    assert gone["revoked_at"] is not None
    assert await s.call(RevokeEndpointKey.SUBJECT, revoke) == gone
    assert (await node_asks(s.server, "a", verify(job_id, key)))["verdict"] == "unknown"

    # what node `a` says of the worker it serves, shown on the job
    now = datetime.now(UTC)
    ids = {"job_id": job_id, "worker": 0, "placement_id": placement, "minion_id": "a"}
    ready = EndpointReady(
        **ids,
        url=job["url"],
        phases=[
            PhaseAt(phase=ColdStartPhase.image_ready, at=now),
            PhaseAt(phase=ColdStartPhase.first_answer, at=now + timedelta(seconds=1)),
        ],
    )
    counts = {"errors": 0, "bytes_in": 10, "bytes_out": 200}
    async with as_identity(s.server, "node", "a") as agent:
        await publish(agent, ready, source="test")
        for n in (3, 5, 5):  # totals: the repeated one changes nothing
            evt = EndpointMetered(**ids, at=now + timedelta(seconds=n), requests=n, **counts)
            await publish(agent, evt, source="test")

    async def shown() -> bool:
        seen = await s.job(job_id)
        return bool(seen["requests"] == 5 and "first_answer" in seen["cold_start"])

    await wait_for_async(shown, timeout=10)
    seen = await s.job(job_id)
    assert list(seen["cold_start"]) == ["placed", "image_ready", "first_answer"]
    assert (seen["bytes_in"], seen["bytes_out"], seen["errors"]) == (10, 200, 0)
