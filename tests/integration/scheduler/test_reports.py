"""What the scheduler keeps of nodes' reports (reports.py), over the real bus: a report that
changed a worker once, on its node's `kept` subject, in the event history; a node's facts
about workers it was never placed on, nowhere, noticed once and counted."""

from __future__ import annotations

import asyncio
import base64
import json
from datetime import UTC, datetime
from typing import Any

import nats.js.errors
from gpufleet_bus.streams import ensure_node_logs
from gpufleet_contracts import envelope_for, subjects
from gpufleet_contracts.jobs import (
    GetJobLogs,
    StagingItem,
    WorkerFinished,
    WorkerStaging,
    WorkerStarted,
    WorkerUploading,
)
from gpufleet_contracts.nodes import NodeState
from gpufleet_devstack import NatsServer, wait_for_async

from ..bus.test_bus import read_stream
from ..conftest import admin_connect
from .test_fleet import Sys, known, registered, state_changed
from .test_fleet import system as system  # the fixture

NOW = datetime.now(UTC)


async def kept(server: NatsServer, fact: str, minion: str) -> list[Any]:
    """(ce-id, body) of what the history holds on `minion`'s kept subject of `fact`."""
    msgs = await read_stream(server, subjects.kept(fact, minion))
    return [((m.headers or {}).get("Nats-Msg-Id"), json.loads(m.data)) for m in msgs]


async def reports_left(server: NatsServer, minion: str) -> int:
    nc = await admin_connect(server)
    try:
        info = await nc.jetstream().stream_info(
            subjects.STREAM_REPORTS, subjects_filter=f"{subjects.EVENTS}.worker.*.{minion}"
        )
        return sum((info.state.subjects or {}).values())
    finally:
        await nc.close()


async def dead_letters(server: NatsServer) -> list[dict[str, Any]]:
    msgs = await read_stream(server, subjects.dead_letter("scheduler", "*"))
    return [json.loads(m.data) for m in msgs]


async def test_a_report_is_kept_once_and_another_nodes_facts_are_not_kept_but_noticed_once(
    system: Sys,
) -> None:
    """Node `a` runs the job and says so twice (a copy sent again under another id): one
    start in the history, under its placement's id. Node `b` states, 300 times on its own
    subject, that `a`'s worker finished: the job keeps running, nothing of `b` is in the
    history or left in REPORTS, and one dead letter names `b` and why (the next are counted
    into the record a minute later, not written each). Then `a`'s end: one, kept."""
    s = system
    await s.node(registered("a", gpus=1, owner="local"))
    await s.node(registered("b", gpus=1, owner="other"))
    await known(s, "a", "b")
    job = await s.submit("reported")
    await wait_for_async(lambda: _one_start(s), timeout=10)
    (start,) = await s.starts("a")
    ids = {"job_id": job["id"], "worker": 0, "placement_id": start.placement_id}

    started = WorkerStarted(**ids, minion_id="a", started_at=NOW)
    await s.worker(started)
    await s.worker(started)
    await s.until(job["id"], "running")

    forged = WorkerFinished(**ids, minion_id="b", state="finished", exit_code=0, ended_at=NOW)
    async with _node(s.server, "b") as js:
        await asyncio.gather(*(_send(js, forged) for _ in range(300)))
    await wait_for_async(lambda: _all_read(s, "b"), timeout=20)
    assert (await s.job(job["id"]))["state"] == "running"
    assert await kept(s.server, "finished", "b") == []
    assert await reports_left(s.server, "b") == 0  # read: nothing of it is kept anywhere
    about_b = [d for d in await dead_letters(s.server) if d.get("node") == "b"]
    assert len(about_b) == 1, about_b
    (record,) = about_b
    assert record["account"] == "other"  # the node's owner sees it (and operators)
    assert record["errors"][0]["rule"] == "worker:not-placed-on-node"
    assert record["reason"] == "ignored" and 1 <= record["count"] <= 300

    finished = WorkerFinished(**ids, minion_id="a", state="finished", exit_code=0, ended_at=NOW)
    await s.worker(finished)
    await s.until(job["id"], "finished")
    pid = start.placement_id
    assert [i for i, _ in await kept(s.server, "started", "a")] == [f"kept:started:{pid}"]
    assert [i for i, _ in await kept(s.server, "finished", "a")] == [f"kept:finished:{pid}"]


async def test_a_finish_read_before_its_start_keeps_the_start_it_claims_once(system: Sys) -> None:
    """A start redelivered behind its finish (a paused scheduler had fetched it): the
    history still holds one start and one end of the placement, the start the finish
    claims, and the late start changes nothing."""
    s = system
    await s.node(registered("a", gpus=1, owner="local"))
    await known(s, "a")
    job = await s.submit("late-start")
    await wait_for_async(lambda: _one_start(s), timeout=10)
    (start,) = await s.starts("a")
    ids = {"job_id": job["id"], "worker": 0, "placement_id": start.placement_id}
    claimed = NOW.replace(microsecond=0)
    await s.worker(
        WorkerFinished(
            **ids, minion_id="a", state="finished", exit_code=0, started_at=claimed, ended_at=NOW
        )
    )
    await s.until(job["id"], "finished")
    await s.worker(WorkerStarted(**ids, minion_id="a", started_at=claimed))
    await wait_for_async(lambda: _all_read(s, "a", ignored=0), timeout=10)
    pid = start.placement_id
    starts = await kept(s.server, "started", "a")
    assert [i for i, _ in starts] == [f"kept:started:{pid}"]
    assert datetime.fromisoformat(starts[0][1]["started_at"]) == claimed
    assert [i for i, _ in await kept(s.server, "finished", "a")] == [f"kept:finished:{pid}"]
    assert (await s.job(job["id"]))["state"] == "finished"


async def test_an_upload_moves_the_job_to_uploading_then_its_finish_ends_it(
    system: Sys,
) -> None:
    """A node's WorkerUploading: the worker and the job `uploading` (kept once in the
    history); its staging report shown on the job and as its progress, never kept; another
    node's uploading report of the worker ignored like other foreign facts; then the finish
    from `uploading` ends it as from `running`."""
    s = system
    await s.node(registered("a", gpus=1, owner="local"))
    await s.node(registered("b", gpus=1, owner="other"))
    await known(s, "a", "b")
    job = await s.submit("uploads")
    await wait_for_async(lambda: _one_start(s), timeout=10)
    (start,) = await s.starts("a")
    ids = {"job_id": job["id"], "worker": 0, "placement_id": start.placement_id}
    await s.worker(WorkerStarted(**ids, minion_id="a", started_at=NOW))
    await s.until(job["id"], "running")

    await s.worker(WorkerUploading(**ids, minion_id="b", at=NOW))  # not b's worker
    await wait_for_async(lambda: _all_read(s, "b", ignored=1), timeout=10)
    assert (await s.job(job["id"]))["state"] == "running"
    assert await kept(s.server, "uploading", "b") == []

    await s.worker(WorkerUploading(**ids, minion_id="a", at=NOW))
    shown = await s.until(job["id"], "uploading")
    assert shown["workers"][0]["state"] == "uploading"
    item = StagingItem(
        name="uploads.zip",
        direction="upload",
        kind="s3",
        names="s3://b/out",
        done=12_000_000,
        total=40_000_000,
        rate=3_000_000,
        state="fetching",
    )
    await s.worker(WorkerStaging(**ids, minion_id="a", at=NOW, items=[item]))

    async def progress_shown() -> bool:
        return bool((await s.job(job["id"])).get("progress"))

    await wait_for_async(progress_shown, timeout=10)
    shown = await s.job(job["id"])
    assert shown["progress"] == "uploading uploads.zip to s3://b/out: 12.0 of 40.0 MB, 3 MB/s"
    assert shown["workers"][0]["staging"][0]["done"] == 12_000_000
    assert [h["state"] for h in shown["history"]][-2:] == ["running", "uploading"]

    await s.worker(
        WorkerFinished(**ids, minion_id="a", state="finished", exit_code=0, ended_at=NOW)
    )
    done = await s.until(job["id"], "finished")
    assert done["progress"] is None and done["workers"][0]["staging"] == []
    pid = start.placement_id
    assert [i for i, _ in await kept(s.server, "uploading", "a")] == [f"kept:uploading:{pid}"]
    assert [i for i, _ in await kept(s.server, "finished", "a")] == [f"kept:finished:{pid}"]
    assert await kept(s.server, "staging", "a") == []  # progress: shown, never kept


async def _one_start(s: Sys) -> bool:
    return len(await s.starts("a")) == 1


async def _all_read(s: Sys, minion: str, ignored: int = 300) -> bool:
    return await reports_left(s.server, minion) == 0 and s.sched.reports.ignored >= ignored


class _node:
    """A node's JetStream context (its own credential)."""

    def __init__(self, server: NatsServer, minion: str) -> None:
        self.server, self.minion = server, minion

    async def __aenter__(self) -> Any:
        self.nc = await nats.connect(
            self.server.url, **NatsServer.client(self.server.creds("node", self.minion))
        )
        return self.nc.jetstream(timeout=10)

    async def __aexit__(self, *exc: object) -> None:
        await self.nc.close()


async def _send(js: Any, msg: WorkerFinished) -> None:
    env = envelope_for(msg, source="test")
    # (refused once its queue is full, as to an agent: not with 300)
    await js.publish(msg.subject(), msg.to_bytes(), headers=env.headers())


async def test_a_jobs_logs_come_from_each_node_it_ran_on_with_a_cursor_per_node(
    system: Sys,
) -> None:
    """A worker placed on `a`, lost with it and placed again on `b`: its log is read from
    both nodes' streams, `a`'s first; a chunk of node `c` for the job (its own stream, its
    own subject) is not shown; the cursor a page gives says, per node, where the next one
    starts: only what came since."""
    s = system
    admin = await admin_connect(s.server)
    try:
        for minion in ("a", "b", "c"):
            await ensure_node_logs(admin.jetstream(), minion)  # the provisioner's part
    finally:
        await admin.close()
    await s.node(registered("a", gpus=1))
    await known(s, "a")
    job = await s.submit("logged")
    await wait_for_async(lambda: _one_start(s), timeout=10)
    await _log(s.server, "a", job["id"], b"from a\n")
    await s.node(registered("b", gpus=1))
    await known(s, "b")
    await s.node(state_changed("a", NodeState.lost))

    async def on_b() -> bool:
        return len(await s.starts("b")) == 1

    await wait_for_async(on_b, timeout=10)
    await _log(s.server, "b", job["id"], b"from b\n")
    await _log(s.server, "c", job["id"], b"INJECTED\n")

    first = await _page(s, job["id"], {})
    assert [c["data"] for c in first["chunks"]] == [b"from a\n", b"from b\n"]
    assert first["cursor"] == {"a": 1, "b": 1} and first["more"] is False
    await _log(s.server, "b", job["id"], b"more\n")
    again = await _page(s, job["id"], first["cursor"])
    assert [c["data"] for c in again["chunks"]] == [b"more\n"]
    assert again["cursor"] == {"a": 1, "b": 2}


async def _log(server: NatsServer, minion: str, job_id: str, data: bytes) -> None:
    """A chunk of worker 0's log, as node `minion`'s agent ships it."""
    async with _node(server, minion) as js:
        await js.publish(subjects.log(minion, job_id, 0), data)


async def _page(s: Sys, job_id: str, cursor: dict[str, int]) -> dict[str, Any]:
    body = GetJobLogs(job_id=job_id, cursor=cursor)
    page = await s.call(GetJobLogs.SUBJECT, body.to_bytes())
    for chunk in page["chunks"]:
        chunk["data"] = base64.b64decode(chunk["data"])
    return page
