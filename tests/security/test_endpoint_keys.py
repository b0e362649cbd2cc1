"""Attack: opening another account's endpoint (R-JOB-6) through its API keys: another
account's create, list and revoke; a node that does not serve the endpoint asking whether a
key opens it, or asking on another node's subject; a revoked key; and the key's secret
looked for wherever the scheduler writes (its replies, its database, the event streams, its
log).

On the real servers (NATS with its permissions, nx-27017) with the scheduler in-process, as
tests/integration/scheduler/test_endpoints.py runs it; the package's `system` is not
started here.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import nats
import pytest
from gpufleet_contracts import subjects
from gpufleet_contracts.jobs import JobSpec, SubmitJob
from gpufleet_contracts.serving import (
    KEYS_PER_ENDPOINT,
    CreateEndpointKey,
    ListEndpointKeys,
    RevokeEndpointKey,
    VerifyEndpointKey,
    parse_key,
)
from integration.bus.test_bus import read_stream
from integration.conftest import connect
from integration.scheduler.test_endpoints import node_asks, served_endpoint, verify
from integration.scheduler.test_fleet import Sys
from integration.scheduler.test_fleet import system as system  # the fixture

ATTACKER = "mallory"


def body(**kw: Any) -> bytes:
    return json.dumps(kw).encode()


async def test_another_account_reaches_no_key_of_an_endpoint(system: Sys) -> None:
    s = system
    job, _ = await served_endpoint(s)
    job_id = job["id"]
    made = await s.call(CreateEndpointKey.SUBJECT, body(job_id=job_id))
    key_id = made["view"]["key_id"]
    for verb, asked in (
        (CreateEndpointKey.SUBJECT, body(job_id=job_id, name="mine")),
        (ListEndpointKeys.SUBJECT, body(job_id=job_id)),
        (RevokeEndpointKey.SUBJECT, body(job_id=job_id, key_id=key_id)),
    ):
        theirs = await s.call(verb, asked, account=ATTACKER)
        missing = await s.call(verb, asked.replace(job_id.encode(), b"j000000000000"), ATTACKER)
        assert theirs["error"]["code"] == "not_found", theirs
        # as for a job that does not exist: nothing says this one does
        assert theirs["error"]["message"] == missing["error"]["message"].replace(
            "j000000000000", job_id
        )
    # the victim's key is as it was: live, one of one
    listed = await s.call(ListEndpointKeys.SUBJECT, body(job_id=job_id))
    assert [(k["key_id"], k["revoked_at"]) for k in listed["keys"]] == [(key_id, None)]
    # a key id of another of the victim's endpoints is not found under this one
    other = await s.call(RevokeEndpointKey.SUBJECT, body(job_id=job_id, key_id="0" * 12))
    assert other["error"]["code"] == "not_found"


async def test_only_the_serving_node_learns_whether_a_key_opens_an_endpoint(
    system: Sys,
) -> None:
    s = system
    job, _ = await served_endpoint(s)  # on node a; node b serves nothing
    made = await s.call(CreateEndpointKey.SUBJECT, body(job_id=job["id"]))
    asked = verify(job["id"], made["key"])
    refused = await node_asks(s.server, "b", asked)
    assert refused["error"]["code"] == "not_found" and "verdict" not in refused
    # nor on the serving node's subject, which the server does not let node b publish
    errors: list[Exception] = []

    async def on_error(exc: Exception) -> None:
        errors.append(exc)

    evil = await connect(s.server, s.server.creds("node", "b"), error_cb=on_error)
    try:
        for as_who in ("a", "*"):
            with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
                await evil.request(
                    subjects.as_node(VerifyEndpointKey.SUBJECT, as_who),
                    asked.to_bytes(),
                    timeout=1,
                )
    finally:
        await evil.close()
    assert any("permissions violation" in str(e).lower() for e in errors)
    # a user cannot ask either: the subject is a node's
    user = await connect(s.server, s.server.creds("user", "eve", account=ATTACKER))
    try:
        with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
            await user.request(
                subjects.as_node(VerifyEndpointKey.SUBJECT, "a"), asked.to_bytes(), timeout=1
            )
    finally:
        await user.close()


async def test_a_revoked_key_is_unknown_and_a_training_job_has_no_keys(system: Sys) -> None:
    s = system
    job, _ = await served_endpoint(s)
    made = await s.call(CreateEndpointKey.SUBJECT, body(job_id=job["id"]))
    assert (await node_asks(s.server, "a", verify(job["id"], made["key"])))["verdict"] == "open"
    key_id = made["view"]["key_id"]
    await s.call(RevokeEndpointKey.SUBJECT, body(job_id=job["id"], key_id=key_id))
    assert (await node_asks(s.server, "a", verify(job["id"], made["key"])))["verdict"] == (
        "unknown"
    )
    spec = JobSpec.model_validate({"name": "t", "gpu_types": ["RTX 3090"], "command": ["true"]})
    training = await s.call(SubmitJob.SUBJECT, SubmitJob(spec=spec).to_bytes())
    refused = await s.call(CreateEndpointKey.SUBJECT, body(job_id=training["id"]))
    assert refused["error"]["code"] == "invalid"
    assert [(f["field"], f["rule"]) for f in refused["error"]["fields"]] == [("job_id", "R-JOB-6")]


async def test_live_keys_are_bounded_per_endpoint(system: Sys) -> None:
    s = system
    job, _ = await served_endpoint(s)
    made = [
        await s.call(CreateEndpointKey.SUBJECT, body(job_id=job["id"]))
        for _ in range(KEYS_PER_ENDPOINT)
    ]
    assert all("key" in m for m in made)
    over = await s.call(CreateEndpointKey.SUBJECT, body(job_id=job["id"]))
    assert over["error"]["code"] == "conflict"
    first = made[0]["view"]["key_id"]
    await s.call(RevokeEndpointKey.SUBJECT, body(job_id=job["id"], key_id=first))
    assert "key" in await s.call(CreateEndpointKey.SUBJECT, body(job_id=job["id"]))


async def test_a_keys_secret_is_nowhere_but_in_its_one_reply(
    system: Sys, caplog: pytest.LogCaptureFixture
) -> None:
    s = system
    caplog.set_level(logging.DEBUG)
    job, _ = await served_endpoint(s)
    made = await s.call(CreateEndpointKey.SUBJECT, body(job_id=job["id"], name="ci"))
    parsed = parse_key(made["key"])
    assert parsed is not None
    key_id, secret = parsed
    listed = await s.call(ListEndpointKeys.SUBJECT, body(job_id=job["id"]))
    revoked = await s.call(RevokeEndpointKey.SUBJECT, body(job_id=job["id"], key_id=key_id))
    await node_asks(s.server, "a", verify(job["id"], made["key"]))
    assert secret not in json.dumps([listed, revoked, await s.job(job["id"])])
    # the scheduler's database, every collection (its outbox too)
    db = s.sched.state.db
    for name in await db.list_collection_names():
        docs = [d async for d in db[name].find({})]
        assert secret not in json.dumps(docs, default=str), name
    # every event and command stream, and the dead letters
    for subject in (f"{subjects.EVENTS}.>", f"{subjects.COMMANDS}.>", f"{subjects.DLQ}.>"):
        assert all(secret.encode() not in m.data for m in await read_stream(s.server, subject))
    # its log names the key by id only
    assert key_id in caplog.text and secret not in caplog.text
