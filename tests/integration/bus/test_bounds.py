"""Bounded by whom (gpufleet_bus.streams): what one node can store is bounded by its own
stream's and subjects' limits, whatever it sends, and never pushes out another's.

Against a real nats-server (auth on, the streams as the services declare them), with the
nodes' own credentials: what JetStream itself enforces, without any gpufleet service.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import nats
import nats.errors
import nats.js.errors
import pytest
from gpufleet_bus import BusSettings
from gpufleet_bus.apply import apply
from gpufleet_bus.streams import (
    REPORTS_PER_SUBJECT,
    STREAMS,
    NodeLogLimits,
    StreamsNotApplied,
    _differs,
    ensure_node_logs,
    ensure_streams,
    node_logs_config,
    stream_config,
)
from gpufleet_contracts import subjects
from gpufleet_devstack import NatsServer
from nats.aio.client import Client
from nats.js.api import ConsumerConfig, StreamConfig

from ..conftest import admin_connect, connect

KIB = 1024
SMALL = NodeLogLimits(max_bytes=1024 * KIB, max_msgs=200)  # a node's budget, small to fill


async def node(server: NatsServer, minion: str) -> Client:
    return await connect(server, server.creds("node", minion))


async def flood(nc: Client, subjects_: list[str], payload: bytes) -> tuple[int, list[str]]:
    """Publish `payload` on each subject, many at once: (acknowledged, refusals' reasons)."""
    js = nc.jetstream(timeout=10)
    headers = {"Nats-Msg-Id": ""}
    acked, refused = 0, []

    async def one(subject: str) -> None:
        nonlocal acked
        try:
            await js.publish(subject, payload, headers={**headers, "Nats-Msg-Id": uuid.uuid4().hex})
        except nats.js.errors.APIError as exc:
            refused.append(str(exc.description))
        else:
            acked += 1

    for i in range(0, len(subjects_), 256):
        await asyncio.gather(*(one(s) for s in subjects_[i : i + 256]))
    return acked, refused


async def state(js: Any, stream: str, subject: str | None = None) -> dict[str, int]:
    info = await js.stream_info(stream, subjects_filter=subject)
    per = info.state.subjects or {}
    return {
        "messages": int(info.state.messages),
        "bytes": int(info.state.bytes),
        "first_seq": int(info.state.first_seq),
        "on_subject": int(per.get(subject, 0)) if subject else 0,
    }


async def test_a_node_flooding_made_up_log_subjects_keeps_its_budget_and_no_other_nodes_logs_go(
    fresh_nats: NatsServer,
) -> None:
    """Node `flooder` writes three times its budget in chunks of 8 KiB on subjects it makes
    up (a new job id each: what no per-subject limit bounds), and as many tiny chunks again:
    its own stream stays within its bytes and messages, its own oldest chunks going first;
    the victim node's stream keeps every chunk it had."""
    admin = await admin_connect(fresh_nats)
    js = admin.jetstream()
    await ensure_streams(js)
    for minion in ("victim", "flooder"):
        await ensure_node_logs(js, minion, SMALL)
    victim, flooder = await node(fresh_nats, "victim"), await node(fresh_nats, "flooder")
    try:
        acked, _ = await flood(victim, [subjects.log("victim", "job-v", 0)] * 3, b"secret\n")
        assert acked == 3
        before = await state(js, subjects.node_logs_stream("victim"))

        made_up = [subjects.log("flooder", f"j{n}", 0) for n in range(3 * 1024 // 8)]
        acked, refused = await flood(flooder, made_up, b"x" * 8 * KIB)
        assert (acked, refused) == (len(made_up), [])  # taken, its own oldest dropped
        tiny = [subjects.log("flooder", f"t{n}", 0) for n in range(3 * SMALL.max_msgs)]
        await flood(flooder, tiny, b".")

        mine = await state(js, subjects.node_logs_stream("flooder"))
        assert mine["bytes"] <= SMALL.max_bytes and mine["messages"] <= SMALL.max_msgs
        assert mine["first_seq"] > len(made_up)  # none of the big chunks is left
        assert await state(js, subjects.node_logs_stream("victim")) == before
        # and it may not write anywhere else: another node's subject is refused
        with pytest.raises(nats.errors.TimeoutError):
            await flooder.jetstream(timeout=0.7).publish(subjects.log("victim", "j", 0), b"x")
    finally:
        for nc in (victim, flooder, admin):
            await nc.close()


async def test_a_node_queues_at_most_so_many_reports_and_no_other_node_waits_for_it(
    fresh_nats: NatsServer,
) -> None:
    """With nobody reading REPORTS (the scheduler away), node `flooder` sends more ends than
    a node may have queued: JetStream takes REPORTS_PER_SUBJECT and refuses the rest to it
    alone (the node sends them again later: nothing is dropped that was taken); another
    node's report still goes in; once read (acked), they are gone, and there is room."""
    admin = await admin_connect(fresh_nats)
    js = admin.jetstream()
    await ensure_streams(js)
    flooder, other = await node(fresh_nats, "flooder"), await node(fresh_nats, "other")
    subject = f"{subjects.EVENTS}.worker.finished.flooder"
    try:
        extra = 50
        acked, refused = await flood(flooder, [subject] * (REPORTS_PER_SUBJECT + extra), b"{}")
        assert acked == REPORTS_PER_SUBJECT
        assert refused == ["maximum messages per subject exceeded"] * extra
        assert (await state(js, subjects.STREAM_REPORTS, subject))["on_subject"] == acked
        theirs = f"{subjects.EVENTS}.worker.finished.other"
        assert (await flood(other, [theirs], b"{}"))[0] == 1
        # nothing of it is in the event history
        with pytest.raises(nats.js.errors.NotFoundError):
            await js.get_last_msg(subjects.STREAM_EVENTS, subject)

        # the scheduler's part: read and ack (a work queue keeps nothing once acked)
        sub = await js.pull_subscribe(
            f"{subjects.EVENTS}.worker.*.*", durable="reader", stream=subjects.STREAM_REPORTS
        )
        while msgs := await _fetch(sub):
            for m in msgs:
                await m.ack()
        await asyncio.sleep(0.2)  # acks are not awaited
        assert (await state(js, subjects.STREAM_REPORTS))["messages"] == 0
        assert (await flood(flooder, [subject], b"{}"))[0] == 1
    finally:
        for nc in (flooder, other, admin):
            await nc.close()


async def _fetch(sub: Any) -> list[Any]:
    try:
        return list(await sub.fetch(256, timeout=1))
    except (TimeoutError, nats.errors.TimeoutError):
        return []


async def test_a_message_over_a_reports_size_is_refused(fresh_nats: NatsServer) -> None:
    """A report is bounded in size too (64 KiB: an honest one is at most ~40 KB)."""
    admin = await admin_connect(fresh_nats)
    await ensure_streams(admin.jetstream())
    flooder = await node(fresh_nats, "flooder")
    try:
        subject = f"{subjects.EVENTS}.worker.started.flooder"
        acked, refused = await flood(flooder, [subject], b"x" * 65 * KIB)
        assert (acked, refused) == (0, ["message size exceeds maximum allowed"])
    finally:
        await flooder.close()
        await admin.close()


async def test_an_earlier_releases_streams_are_applied_by_an_operator_not_by_a_service(
    fresh_nats: NatsServer,
) -> None:
    """A store of an earlier release: EVENTS took every event subject, GPUFLEET_LOGS every
    node's logs (2 GiB, the oldest first). A service cannot change them, so it says what is
    to be done (StreamsNotApplied: REPORTS cannot be made); the operator's apply deletes the
    shared log stream and narrows EVENTS, keeping its history, and the streams of this
    release are made."""
    admin = await admin_connect(fresh_nats)
    js = admin.jetstream()
    old_events = StreamConfig(name=subjects.STREAM_EVENTS, subjects=[f"{subjects.EVENTS}.>"])
    await js.add_stream(old_events)
    await js.add_stream(
        StreamConfig(name=subjects.STREAM_LOGS, subjects=[f"{subjects.LOGS}.>"], max_bytes=2**31)
    )
    await js.publish(subjects.event("job", "queued"), b"{}")  # the history
    old_reader = ConsumerConfig(  # the scheduler read nodes' reports from EVENTS
        durable_name="scheduler-worker-events", filter_subject=subjects.WORKER_REPORTS
    )
    await js.add_consumer(subjects.STREAM_EVENTS, old_reader)
    service = await connect(fresh_nats, fresh_nats.creds("service", "billing"))
    try:
        with pytest.raises(StreamsNotApplied, match="an operator applies"):
            await ensure_streams(service.jetstream())
        settings = BusSettings(nats_url=fresh_nats.url, nats_creds=fresh_nats.creds("operator"))
        await apply(settings)  # python -m gpufleet_bus.apply
        names = {s.config.name async for s in _streams(js)}
        assert names == {spec.name for spec in STREAMS}  # GPUFLEET_LOGS is gone
        events = await js.stream_info(subjects.STREAM_EVENTS)
        assert events.state.messages == 1
        assert await js.consumers_info(subjects.STREAM_EVENTS) == []  # the old reader too
        want = stream_config(STREAMS[0])
        assert events.config.subjects == want.subjects
        await ensure_node_logs(js, "m1")  # the node's subjects are free for its own stream
    finally:
        await service.close()
        await admin.close()


async def _streams(js: Any) -> Any:
    for info in await js.streams_info():
        yield info


async def test_the_streams_as_made_are_as_declared_so_no_service_warns_of_a_difference(
    fresh_nats: NatsServer,
) -> None:
    """What the server answers of each stream made (defaults filled in) is what this
    release declares: a service starting next to them finds nothing to report."""
    admin = await admin_connect(fresh_nats)
    js = admin.jetstream()
    try:
        await ensure_streams(js)
        await ensure_node_logs(js, "m1")
        for spec in STREAMS:
            assert not _differs((await js.stream_info(spec.name)).config, stream_config(spec))
        have = (await js.stream_info(subjects.node_logs_stream("m1"))).config
        assert not _differs(have, node_logs_config("m1"))
    finally:
        await admin.close()
