"""Requests (gpufleet_bus.requests, the one request mechanism), against a real nats-server:
validation, error replies (Refused, NotFound, internal) and the dead-letter record."""

from __future__ import annotations

import asyncio
import json

import nats
import pytest
from gpufleet_bus import Ports, Request, ServiceRuntime
from gpufleet_contracts import subjects
from gpufleet_contracts.errors import NotFound, Refused
from gpufleet_contracts.jobs import SubmitJob
from gpufleet_devstack import NatsServer

from ..conftest import admin_connect, as_user, broker_for, running
from .test_bus import read_stream

GOOD = {"spec": {"name": "x", "gpu_types": ["RTX 3090"], "command": ["true"]}}


async def test_fast_request_validates_like_every_other_request(fresh_nats: NatsServer) -> None:
    broker = broker_for("svc", fresh_nats)
    rt = ServiceRuntime("svc", Ports(broker))
    seen: list[tuple[str, str]] = []

    async def submit(body: SubmitJob, account: str) -> dict[str, str]:
        seen.append((body.spec.name, account))
        return {"id": "j1"}

    rt.wire(requests={"submit": submit})

    async with running(rt.app):
        subject = subjects.rpc("svc", "submit")
        bad = {"spec": {**GOOD["spec"], "disk_size_gb": 5}}
        async with as_user(fresh_nats, "acme") as user:
            ok = await user.request(subject, json.dumps(GOOD).encode(), 5)
            refused = await user.request(subject, json.dumps(bad).encode(), 5)
            garbage = await user.request(subject, b"\xff not json", 5)
            # Acting for another account: the server drops the publish, nothing answers.
            with pytest.raises(nats.errors.TimeoutError):
                await user.nc.request(
                    subjects.as_account(subject, "other"), json.dumps(GOOD).encode(), timeout=1
                )
        # A subject whose account token is not an account name is refused, never served.
        nc = await admin_connect(fresh_nats)
        unowned = await nc.request(
            subjects.as_account(subject, "@nobody"), json.dumps(GOOD).encode(), timeout=5
        )
        await nc.close()
    assert json.loads(ok.data) == {"id": "j1"}
    assert seen == [("x", "acme")]  # the account is the subject's, never a header's
    assert json.loads(unowned.data)["error"]["code"] == "invalid"
    body = json.loads(refused.data)
    assert body["ok"] is False and body["error"]["code"] == "invalid"
    assert body["error"]["fields"] == [
        {
            "field": "spec.disk_size_gb",
            "rule": "R-JOB-2",
            "message": "Input should be greater than or equal to 10",
            "valid": "10..1000 GB per worker",
        }
    ]
    assert json.loads(garbage.data)["error"]["code"] == "invalid"
    dead = [
        json.loads(m.data) for m in await read_stream(fresh_nats, subjects.dead_letter("svc", "*"))
    ]
    assert [d["reason"] for d in dead] == ["invalid", "invalid"]
    assert dead[0]["payload"] == bad  # kept as JSON (redacted of secrets)
    assert dead[0]["account"] == "acme"
    assert dead[1]["payload_encoding"] == "opaque"  # not JSON: its size and hash only


async def test_fast_request_failure_answers_internal_and_requests_run_concurrently(
    fresh_nats: NatsServer,
) -> None:
    broker = broker_for("svc", fresh_nats)
    rt = ServiceRuntime("svc", Ports(broker))
    gate = asyncio.Event()
    inside = 0

    async def slow(body: SubmitJob, account: str) -> dict[str, int]:
        nonlocal inside
        inside += 1
        if body.spec.name == "boom":
            raise RuntimeError("database away")
        if body.spec.name == "refused":
            raise Refused(
                "conflict", "no", [{"field": "spec.name", "rule": "R-X-1", "message": "m"}]
            )
        if body.spec.name == "missing":
            raise NotFound("job x not found")
        if inside >= 20:
            gate.set()
        await asyncio.wait_for(gate.wait(), 5)  # only returns once 20 are in at once
        return {"inside": inside}

    rt.wire(requests={"slow": Request(slow, concurrency=64)})

    async with running(rt.app):
        subject = subjects.rpc("svc", "slow")
        async with as_user(fresh_nats, "acme") as user:
            replies = await asyncio.gather(
                *(user.request(subject, json.dumps(GOOD).encode(), 10) for _ in range(20))
            )
            boom = {"spec": {**GOOD["spec"], "name": "boom"}}
            failed = await user.request(subject, json.dumps(boom).encode(), 5)
            no = {"spec": {**GOOD["spec"], "name": "refused"}}
            refused = json.loads((await user.request(subject, json.dumps(no).encode(), 5)).data)
            gone = {"spec": {**GOOD["spec"], "name": "missing"}}
            missing = json.loads((await user.request(subject, json.dumps(gone).encode(), 5)).data)
    assert all(json.loads(r.data)["inside"] >= 20 for r in replies)
    error = json.loads(failed.data)["error"]
    assert (error["code"], error["message"]) == ("internal", "RuntimeError")
    assert refused["error"]["code"] == "conflict"
    assert refused["error"]["fields"][0]["rule"] == "R-X-1"
    assert missing["error"] == {"code": "not_found", "message": "job x not found", "fields": []}
    assert await read_stream(fresh_nats, subjects.dead_letter("svc", "*")) == []  # not invalid


async def test_a_started_service_has_its_request_subscriptions_on_the_server(
    fresh_nats: NatsServer,
) -> None:
    """Once app.start() returns, a request on another connection finds its responder: the
    server already holds the service's subscriptions (CI once saw "no responders" for the
    first request after a start on a loaded machine). Read from the server's monitor before
    this loop can run the client's flusher again."""
    import urllib.request

    broker = broker_for("svc", fresh_nats)
    rt = ServiceRuntime("svc", Ports(broker))

    async def ping(body: SubmitJob, account: str) -> dict[str, str]:
        return {"ok": "yes"}

    rt.wire(requests={"verb0": ping})
    await rt.app.start()
    try:
        # blocking on purpose: nothing else on this loop runs until the answer is read
        asked = subjects.as_account(subjects.rpc("svc", "verb0"), "acme")
        url = f"{fresh_nats.monitor_url}/subsz?subs=1&limit=100000&test={asked}"
        with urllib.request.urlopen(url, timeout=5) as r:  # noqa: ASYNC210
            subs = json.loads(r.read())
        held = {s["subject"] for s in subs.get("subscriptions_list", [])}
        assert subjects.as_account(subjects.rpc("svc", "verb0"), "*") in held, sorted(held)
    finally:
        await rt.app.stop()
