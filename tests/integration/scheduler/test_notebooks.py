"""A notebook in the scheduler over the real bus and database (R-JOB-1): submitted without a
command, it gets a token sealed at rest and to its node, its worker is served at a URL like an
endpoint's, and only its creator gets its URL with its token (open_notebook); the token is in
no event, command in clear, reply but that one, stored field in clear, or log line."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

import bson
import nats
import pytest
from gpufleet_contracts import subjects
from gpufleet_contracts.identity import AccountChanged, Plan
from gpufleet_contracts.jobs import JobSpec, ListJobs, SubmitJob
from gpufleet_contracts.projects import AddProjectMember, CreateProject
from gpufleet_contracts.secrets import REDACTED
from gpufleet_contracts.serving import (
    NOTEBOOK_COMMAND,
    NOTEBOOK_HEALTH_PATH,
    NOTEBOOK_TOKEN_ENV,
    OpenNotebook,
    ServingKind,
)
from gpufleet_devstack import wait_for_async
from gpufleet_scheduler import jobrequest
from gpufleet_store import Store

from ..conftest import admin_connect
from .test_endpoints import PROXY
from .test_fleet import Sys, known, registered
from .test_fleet import system as system  # the fixture


def notebook_spec(name: str = "nb", **kw: Any) -> JobSpec:
    return JobSpec.model_validate(
        {"name": name, "type": "notebook", "gpu_types": ["RTX 3090"], **kw}
    )


async def stream_bytes(s: Sys, stream: str) -> list[bytes]:
    """The headers and body of every message `stream` holds, read as an operator."""
    nc = await admin_connect(s.server)
    try:
        js = nc.jetstream()
        info = await js.stream_info(stream)
        out: list[bytes] = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            if not info.state.messages:
                break
            try:
                msg = await js.get_msg(stream, seq)
            except nats.js.errors.NotFoundError:
                continue
            out.append(json.dumps(msg.headers or {}).encode() + (msg.data or b""))
        return out
    finally:
        await nc.close()


async def db_bytes(store: Store) -> bytes:
    """Every document of the scheduler's database, BSON-encoded."""
    return b"".join(
        [
            bson.encode(doc)
            for name in await store.db.list_collection_names()
            for doc in await store.db[name].find({}).to_list(None)
        ]
    )


async def open_as(s: Sys, job_id: str, account: str = "local") -> dict[str, Any]:
    return await s.call(OpenNotebook.SUBJECT, OpenNotebook(job_id=job_id).to_bytes(), account)


async def test_a_notebooks_token_reaches_its_creator_and_its_node_only(
    system: Sys, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    s = system
    node = registered("a", gpus=1, sealing=True).model_copy(update={"proxy_url": PROXY})
    await s.node(node)
    await known(s, "a")
    submitted = await s.call(SubmitJob.SUBJECT, SubmitJob(spec=notebook_spec()).to_bytes())
    job_id = submitted["id"]
    assert submitted["spec"]["env"] == {NOTEBOOK_TOKEN_ENV: REDACTED}

    async def started() -> bool:
        return any(w.job_id == job_id for w in await s.starts("a"))

    await wait_for_async(started, timeout=10)
    (start,) = [w for w in await s.starts("a") if w.job_id == job_id]
    assert start.serving is not None
    assert (start.serving.kind, start.serving.health_path) == (
        ServingKind.notebook,
        NOTEBOOK_HEALTH_PATH,
    )
    assert start.command == list(NOTEBOOK_COMMAND)
    assert start.env == {} and start.sealed_secrets is not None  # sealed to node a's key

    # stored: "<secret>" in the spec, the value sealed with the scheduler's key
    doc = await s.sched.state.db.jobs.find_one({"_id": job_id})
    assert doc is not None and doc["spec"]["env"] == {NOTEBOOK_TOKEN_ENV: REDACTED}
    token = jobrequest.env_of(doc, s.sched.state.box)[NOTEBOOK_TOKEN_ENV]
    assert len(token) == 43
    assert token.encode() not in await db_bytes(s.sched.state.store)

    # its creator opens it: the URL with a trailing slash, the token, not ready yet
    shown = await s.job(job_id)
    assert shown["url"] == f"http://{job_id}.a.localhost:8480"
    opened = await open_as(s, job_id)
    assert opened == {"job_id": job_id, "url": shown["url"] + "/", "token": token, "ready": False}
    # another account: as for a job that does not exist
    other = await open_as(s, job_id, "other")
    assert other["error"]["code"] == "not_found"

    # a training job has no token
    training = await s.submit("train")
    refused = await open_as(s, training["id"])
    assert refused["error"]["code"] == "invalid"
    assert refused["error"]["fields"][0]["field"] == "job_id"

    # nowhere else: replies, events, commands in clear, reports, dead letters, log lines
    listed = await s.call(ListJobs.SUBJECT, ListJobs().to_bytes())
    for reply in (submitted, shown, listed, other, refused):
        assert token not in json.dumps(reply)
    for stream in (
        subjects.STREAM_EVENTS,
        subjects.STREAM_COMMANDS,
        subjects.STREAM_REPORTS,
        subjects.STREAM_DLQ,
    ):
        assert all(token.encode() not in b for b in await stream_bytes(s, stream)), stream
    assert token not in caplog.text


async def test_a_federated_notebook_is_opened_by_its_creator_not_its_projects_owner(
    system: Sys,
) -> None:
    s = system
    for account in ("acme", "local"):  # as the provisioner tells of them
        changed = AccountChanged(account=account, plan=Plan.free, at=datetime.now(UTC))
        await s.sched.projects.account_changed(changed)
    await s.call(CreateProject.SUBJECT, CreateProject(name="lab").to_bytes(), "acme")
    member = AddProjectMember(project="lab", account="local")
    added = await s.call(AddProjectMember.SUBJECT, member.to_bytes(), "acme")
    assert "local" in added["members"], added
    spec = notebook_spec("fed", project="acme/lab")
    submitted = await s.call(SubmitJob.SUBJECT, SubmitJob(spec=spec).to_bytes())
    job_id = submitted["id"]
    assert submitted["owner"] == "acme" and submitted["creator"] == "local"
    # the owner sees the job, never its token
    assert (await s.job(job_id, "acme"))["id"] == job_id
    assert (await open_as(s, job_id, "acme"))["error"]["code"] == "not_found"
    # its creator is told why there is no URL yet (no node takes it)
    waiting = await open_as(s, job_id)
    assert waiting["error"]["code"] == "conflict"
    assert "not running yet" in waiting["error"]["message"]


async def test_a_notebook_that_sets_its_own_token_is_refused(system: Sys) -> None:
    spec = notebook_spec(env={NOTEBOOK_TOKEN_ENV: "chosen-by-me"})
    refused = await system.call(SubmitJob.SUBJECT, SubmitJob(spec=spec).to_bytes())
    assert refused["error"]["code"] == "invalid"
    assert [(f["field"], f["rule"]) for f in refused["error"]["fields"]] == [
        ("spec.env", "R-JOB-1")
    ]
    assert "chosen-by-me" not in json.dumps(refused)
