"""The streams' limits as declared (gpufleet_bus.streams), and where each subject is
stored: what docs/reliability.md ("What a node or an account can store") says."""

from __future__ import annotations

import pytest
from gpufleet_bus.streams import (
    NODE_LOG_MAX_BYTES,
    NODE_LOG_MAX_MSGS,
    STREAMS,
    NodeLogLimits,
    node_logs_config,
    stream_config,
    stream_for,
)
from gpufleet_contracts import subjects
from gpufleet_contracts.jobs import WorkerFinished, WorkerPlaced, WorkerStarted
from nats.js.api import DiscardPolicy, RetentionPolicy

KIB = 1024
E = subjects.EVENTS


def test_reports_events_dead_letters_and_a_nodes_logs_are_bounded_as_documented() -> None:
    configs = {spec.name: stream_config(spec) for spec in STREAMS}
    reports = configs[subjects.STREAM_REPORTS]
    assert reports.subjects == [f"{E}.*.*.*"]
    assert reports.retention == RetentionPolicy.WORK_QUEUE
    assert (reports.discard, reports.discard_new_per_subject) == (DiscardPolicy.NEW, True)
    assert (reports.max_msgs_per_subject, reports.max_msg_size) == (1000, 64 * KIB)
    assert reports.max_bytes == 512 * KIB * KIB
    events = configs[subjects.STREAM_EVENTS]
    assert events.subjects == [f"{E}.*.*", f"{E}.*.*.*.>"]
    assert (events.max_bytes, events.max_msgs_per_subject, events.discard) == (
        -1,
        -1,
        DiscardPolicy.OLD,
    )
    dlq = configs[subjects.STREAM_DLQ]
    assert (dlq.max_msgs_per_subject, dlq.discard) == (10_000, DiscardPolicy.OLD)
    assert subjects.STREAM_LOGS not in configs  # no log stream shared by every node
    logs = node_logs_config("m1")
    assert logs.name == "GPUFLEET_LOGS_m1" and logs.subjects == [f"{subjects.LOGS}.m1.>"]
    assert (logs.max_bytes, logs.max_msgs) == (NODE_LOG_MAX_BYTES, NODE_LOG_MAX_MSGS)
    assert (logs.discard, logs.deny_delete, logs.deny_purge) == (DiscardPolicy.OLD, True, True)
    small = node_logs_config("m1", NodeLogLimits(max_bytes=2**20, max_msgs=10))
    assert (small.max_bytes, small.max_msgs) == (2**20, 10)


@pytest.mark.parametrize(
    ("subject", "stream"),
    [
        (WorkerStarted.SUBJECT.format(minion_id="m1"), subjects.STREAM_REPORTS),
        (WorkerFinished.SUBJECT.format(minion_id="m1"), subjects.STREAM_REPORTS),
        (f"{E}.node.gpu_checked.m1", subjects.STREAM_REPORTS),
        (subjects.WORKER_REPORTS, subjects.STREAM_REPORTS),  # the scheduler's consumer
        (subjects.kept("started", "m1"), subjects.STREAM_EVENTS),
        (subjects.kept("finished", "m1"), subjects.STREAM_EVENTS),
        (WorkerPlaced.SUBJECT, subjects.STREAM_EVENTS),
        (subjects.WORKER_EVENTS, subjects.STREAM_EVENTS),  # billing's, across both shapes
        (f"{E}.>", subjects.STREAM_EVENTS),
        (subjects.log("m1", "job", 0), "GPUFLEET_LOGS_m1"),
        (f"{subjects.LOGS}.m1.job.*", "GPUFLEET_LOGS_m1"),
        (f"{subjects.LOGS}.*.job.*", None),  # no one stream holds every node's
        (subjects.dead_letter("scheduler", "acme"), subjects.STREAM_DLQ),
        (subjects.heartbeat("m1"), None),
    ],
)
def test_each_subject_goes_to_its_stream(subject: str, stream: str | None) -> None:
    assert stream_for(subject) == stream
