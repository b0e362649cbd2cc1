"""The JetStream streams of gpufleet, declared in this one place.

Every service declares them at start-up (`ensure_streams`); declaring is idempotent, so the
first process up creates them and the others find them. Replicas follow the cluster size:
1 on a single development server, 3 in the compose cluster (GPUFLEET_STREAM_REPLICAS).

Bounded by whom (docs/reliability.md, "What a node or an account can store"): every
identity sits in one NATS account, so JetStream's own limits per stream and per subject are
what keep one sender from filling a stream or pushing another's messages out.

- A node's worker logs go to a stream of its own (`node_logs_config`, made by the
  provisioner when it enrols): its `max_bytes` and `max_msgs` bound what the node can store,
  however many subjects it invents under `log.<minion_id>.>`, and its output pushes out only
  its own older output.
- A node's reports (`evt.<domain>.<fact>.<minion_id>`, the one three-token shape) go to
  REPORTS, a work queue: each node subject holds at most REPORTS_PER_SUBJECT messages not yet
  read (`discard_new_per_subject`: more are refused to that node alone, which sends them
  again later), and what a service has read is gone. What the scheduler takes of them it
  states in the event history itself (`subjects.kept`); the rest is never kept.
- Dead letters: at most DLQ_PER_SUBJECT records per service and account, and per node, the
  oldest going first: one account's or node's refusals never push out another's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from gpufleet_contracts import subjects
from nats import errors as nats_errors
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import BadRequestError, NotFoundError, ServiceUnavailableError

DAY = 24 * 3600
MIB = 1024**2
# One node's log stream (provisioner settings GPUFLEET_NODE_LOG_MAX_BYTES / _MAX_MSGS): four
# workers' whole output at the agent's cap (64 MiB each), 14 days at most. The message
# count bounds what the server holds in memory for it: a few hundred bytes a message, about
# 30 MiB for a full stream, 30 more when the node made up a subject for each message
# (benchmarks/bounds).
NODE_LOG_MAX_BYTES = 256 * MIB
NODE_LOG_MAX_MSGS = 131_072
# A node's reports not yet read, per subject (its starts, its ends): far above what an
# honest node reports while the scheduler is away for minutes; bytes at most 64 KiB each.
REPORTS_PER_SUBJECT = 1_000
REPORT_MAX_BYTES = 64 * 1024
REPORTS_MAX_BYTES = 512 * MIB
DLQ_PER_SUBJECT = 10_000
log = logging.getLogger("gpufleet.bus")


@dataclass(frozen=True)
class StreamSpec:
    name: str
    subjects: list[str]
    max_age_s: float
    duplicate_window_s: float = 600
    description: str = ""
    max_bytes: int = -1  # -1: bounded by age alone
    max_msgs: int = -1
    max_msgs_per_subject: int = -1
    max_msg_size: int = -1
    work_queue: bool = False  # a message is gone once read and acked
    # full: refuse new messages (per subject with a per-subject cap) instead of dropping old
    discard_new: bool = False


STREAMS: tuple[StreamSpec, ...] = (
    StreamSpec(
        subjects.STREAM_EVENTS,
        # `<domain>.<event>`, and four tokens or more (`worker.kept.<fact>.<minion_id>`);
        # three (`<domain>.<fact>.<minion_id>`) is a node's report: REPORTS
        [f"{subjects.EVENTS}.*.*", f"{subjects.EVENTS}.*.*.*.>"],
        30 * DAY,
        description="Every domain event; the history billing can be rebuilt from.",
    ),
    StreamSpec(
        subjects.STREAM_REPORTS,
        [f"{subjects.EVENTS}.*.*.*"],
        7 * DAY,
        description="What nodes report (a worker started, finished), until a service reads it.",
        max_bytes=REPORTS_MAX_BYTES,
        max_msgs_per_subject=REPORTS_PER_SUBJECT,
        max_msg_size=REPORT_MAX_BYTES,
        work_queue=True,
        discard_new=True,
    ),
    StreamSpec(
        subjects.STREAM_COMMANDS,
        [f"{subjects.COMMANDS}.>"],
        7 * DAY,
        description="Durable commands to one receiver (a node, the provisioner).",
    ),
    StreamSpec(
        subjects.STREAM_DLQ,
        [f"{subjects.DLQ}.>"],
        90 * DAY,
        description="Messages a service refused, with the reason, kept for inspection.",
        max_msgs_per_subject=DLQ_PER_SUBJECT,
    ),
)
# Streams of earlier releases: an operator's `ensure_streams(update=True)` and the
# provisioner at start-up delete them. GPUFLEET_LOGS held every node's logs in 2 GiB, the
# oldest first: ~262,000 chunks of 8 KiB from one node pushed every account's logs out.
RETIRED = (subjects.STREAM_LOGS,)
# ... and consumers: the scheduler read nodes' reports from EVENTS; it reads REPORTS now.
RETIRED_CONSUMERS = ((subjects.STREAM_EVENTS, "scheduler-worker-events"),)
LOGS_MAX_AGE_S = 14 * DAY


def stream_for(subject: str) -> str | None:
    """The stream that stores `subject` (a literal subject, or a consumer's filter), or
    None: core NATS. A filter that spans streams is read from the first that holds some of
    it: billing's `evt.worker.>` from EVENTS (the scheduler's placements and kept facts,
    and the nodes' reports of earlier releases), not from REPORTS. A log subject's stream
    is its node's."""
    if subject.startswith(f"{subjects.LOGS}."):
        minion_id = subjects.token_at(subject, 3)
        wild = minion_id in (None, "*", ">")
        return None if wild else subjects.node_logs_stream(str(minion_id))
    for matches in (_within, _overlaps):
        for spec in STREAMS:
            if any(matches(subject, pattern) for pattern in spec.subjects):
                return spec.name
    return None


def _overlaps(subject: str, pattern: str) -> bool:
    """Whether some literal subject matches both (wildcards on either side)."""
    a, b = subject.split("."), pattern.split(".")
    for i in range(max(len(a), len(b))):
        x = a[i] if i < len(a) else None
        y = b[i] if i < len(b) else None
        if x == ">" or y == ">":
            return x is not None and y is not None
        if x is None or y is None:
            return False
        if x != y and "*" not in (x, y):
            return False
    return True


def _within(subject: str, pattern: str) -> bool:
    """Whether every subject `subject` stands for matches `pattern` (NATS wildcards)."""
    sub, pat = subject.split("."), pattern.split(".")
    for i, p in enumerate(pat):
        if p == ">":
            return len(sub) > i
        if i >= len(sub) or sub[i] == ">" or (p != "*" and p != sub[i]):
            return False
    return len(sub) == len(pat)


def stream_config(spec: StreamSpec, replicas: int = 1) -> StreamConfig:
    return StreamConfig(
        name=spec.name,
        description=spec.description,
        subjects=spec.subjects,
        retention=RetentionPolicy.WORK_QUEUE if spec.work_queue else RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        max_age=spec.max_age_s,
        max_bytes=spec.max_bytes,
        max_msgs=spec.max_msgs,
        max_msgs_per_subject=spec.max_msgs_per_subject,
        max_msg_size=spec.max_msg_size,
        duplicate_window=spec.duplicate_window_s,
        discard=DiscardPolicy.NEW if spec.discard_new else DiscardPolicy.OLD,
        discard_new_per_subject=spec.discard_new and spec.max_msgs_per_subject > 0,
        num_replicas=replicas,
        deny_delete=True,
        deny_purge=True,
    )


async def ensure_streams(js: JetStreamContext, replicas: int = 1, *, update: bool = False) -> None:
    """Create the streams that are missing. An existing stream is updated only with `update`
    (an operator: `just up`); a service may create a stream but not change one (its
    credential has no STREAM.UPDATE: a changed configuration could add subjects, shorten
    retention or seal the stream), so a difference is logged for an operator to apply.
    Streams refuse purges and message deletes: history is removed by age alone (and by the
    limits of each stream: see above). The operator's update also deletes the streams of
    earlier releases (RETIRED), before the new ones that take their subjects."""
    if update:
        await retire_streams(js)
    for spec in STREAMS:
        config = stream_config(spec, replicas)
        try:
            info = await js.stream_info(spec.name)
        except NotFoundError:
            await _add(js, config)
            continue
        if update:
            await js.update_stream(config)
        elif _differs(info.config, config):
            log.warning(
                "stream %s differs from this release's configuration; an operator applies it "
                "(`just up` does)",
                spec.name,
            )


SUBJECTS_OVERLAP = 10065  # JetStream: "subjects overlap with an existing stream"


class StreamsNotApplied(RuntimeError):
    """A stream of this release cannot be made: an earlier release's stream holds its
    subjects. An operator applies this release's streams first."""


async def _add(js: JetStreamContext, config: StreamConfig) -> None:
    try:
        await js.add_stream(config)
    except BadRequestError as exc:
        if exc.err_code != SUBJECTS_OVERLAP:
            raise
        raise StreamsNotApplied(
            f"stream {config.name} cannot be made: another stream holds its subjects (an "
            "earlier release's configuration); an operator applies this release's streams "
            '(`just up` does; compose: docs/reliability.md, "Upgrading the streams")'
        ) from exc


# What JetStream answers while it is not ready yet: a cluster still electing its meta
# leader, a server still starting (no answer, "no responders", 503).
NOT_READY = (nats_errors.TimeoutError, nats_errors.NoRespondersError, ServiceUnavailableError)


async def ensure_streams_when_ready(
    js: JetStreamContext,
    replicas: int = 1,
    *,
    update: bool = False,
    wait_s: float = 120.0,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """`ensure_streams`, asked again while JetStream is not ready yet (a service started
    beside a cluster that has not elected its meta leader must wait, not exit), for up to
    `wait_s` seconds in all (then the last error: the service exits, its supervisor
    restarts it)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    pause = 0.5
    while True:
        try:
            await ensure_streams(js, replicas, update=update)
            return
        except NOT_READY as exc:
            if loop.time() + pause > deadline:
                raise
            why = type(exc).__name__
            log.warning("JetStream not ready (%s); asking again in %.1f s", why, pause)
        await sleep(pause)
        pause = min(pause * 2, 5.0)


def _differs(have: StreamConfig, want: StreamConfig) -> bool:
    keys = (
        "subjects",
        "retention",
        "max_age",
        "max_bytes",
        "max_msgs",
        "max_msgs_per_subject",
        "max_msg_size",
        "discard",
        "discard_new_per_subject",
        "duplicate_window",
        "deny_delete",
        "deny_purge",
    )
    return any(getattr(have, k) != getattr(want, k) for k in keys)


async def retire_streams(js: JetStreamContext) -> list[str]:
    """Delete the streams and consumers of earlier releases (RETIRED, RETIRED_CONSUMERS)
    that are still there; their names."""
    gone = []
    for name in RETIRED:
        try:
            await js.delete_stream(name)
        except NotFoundError:
            continue
        log.warning("deleted stream %s, retired by this release (its messages with it)", name)
        gone.append(name)
    for stream, consumer in RETIRED_CONSUMERS:
        try:
            await js.delete_consumer(stream, consumer)
        except NotFoundError:
            continue
        log.warning("deleted consumer %s of %s, retired by this release", consumer, stream)
        gone.append(f"{stream}/{consumer}")
    return gone


# --- one node's log stream: made when it enrols, deleted when it is revoked -------------


@dataclass(frozen=True)
class NodeLogLimits:
    """What one node may keep in its log stream: bytes and messages, oldest first out."""

    max_bytes: int = NODE_LOG_MAX_BYTES
    max_msgs: int = NODE_LOG_MAX_MSGS


def node_logs_config(
    minion_id: str, limits: NodeLogLimits = NodeLogLimits(), replicas: int = 1
) -> StreamConfig:
    """One node's worker logs (`log.<minion_id>.>`): whatever subjects the node makes up
    there, it keeps at most `limits` in all, and its own oldest chunks go first."""
    spec = StreamSpec(
        subjects.node_logs_stream(minion_id),
        [f"{subjects.LOGS}.{minion_id}.>"],
        LOGS_MAX_AGE_S,
        duplicate_window_s=120,
        description=f"Worker stdout/stderr of node {minion_id}, read by `gpufleet job logs`.",
        max_bytes=limits.max_bytes,
        max_msgs=limits.max_msgs,
    )
    return stream_config(spec, replicas)


async def ensure_node_logs(
    js: JetStreamContext,
    minion_id: str,
    limits: NodeLogLimits = NodeLogLimits(),
    replicas: int = 1,
    *,
    update: bool = False,
) -> None:
    """Make the node's log stream if missing (with `update`, apply `limits` to one that
    differs). JetStream refuses it when the server cannot reserve its `max_bytes`
    ("insufficient storage resources"): the node cannot keep logs, and must not run jobs."""
    config = node_logs_config(minion_id, limits, replicas)
    try:
        info = await js.stream_info(config.name or "")
    except NotFoundError:
        await js.add_stream(config)
        return
    if update and _differs(info.config, config):
        await js.update_stream(config)


async def delete_node_logs(js: JetStreamContext, minion_id: str) -> None:
    with contextlib.suppress(NotFoundError):
        await js.delete_stream(subjects.node_logs_stream(minion_id))


def node_consumer(minion_id: str) -> str:
    """The durable consumer of one node's commands."""
    return f"node-{minion_id}"


def node_consumer_config(minion_id: str) -> ConsumerConfig:
    """One node's commands (StartWorker, StopWorker), in order, on one consumer.

    The provisioner creates it when the node enrols; the node's credential may only read
    and ack it (gpufleet_auth.permissions), so a node can never choose its own filter.
    It delivers only the commands published after it was created: a host enrolled (again)
    under a minion id is never handed the commands retained from before its enrolment.
    """
    name = node_consumer(minion_id)
    return ConsumerConfig(
        durable_name=name,
        filter_subject=f"{subjects.COMMANDS}.node.{minion_id}.*",
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=60,
        max_deliver=-1,
        deliver_policy=DeliverPolicy.NEW,
    )


async def ensure_node_consumer(js: JetStreamContext, minion_id: str) -> None:
    await js.add_consumer(subjects.STREAM_COMMANDS, config=node_consumer_config(minion_id))


async def delete_node_consumer(js: JetStreamContext, minion_id: str) -> None:
    with contextlib.suppress(NotFoundError):
        await js.delete_consumer(subjects.STREAM_COMMANDS, node_consumer(minion_id))
