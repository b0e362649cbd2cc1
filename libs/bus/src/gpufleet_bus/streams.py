"""The JetStream streams of gpufleet, declared in this one place.

Every service declares them at start-up (`ensure_streams`); declaring is idempotent, so the
first process up creates them and the others find them. Replicas follow the cluster size:
1 on a single development server, 3 in the compose cluster (GPUFLEET_STREAM_REPLICAS).
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
from nats.js.errors import NotFoundError, ServiceUnavailableError

DAY = 24 * 3600
LOGS_MAX_BYTES = 2 * 1024**3
log = logging.getLogger("gpufleet.bus")


@dataclass(frozen=True)
class StreamSpec:
    name: str
    subjects: list[str]
    max_age_s: float
    duplicate_window_s: float = 600
    description: str = ""
    max_bytes: int = -1  # -1: bounded by age alone


STREAMS: tuple[StreamSpec, ...] = (
    StreamSpec(
        subjects.STREAM_EVENTS,
        [f"{subjects.EVENTS}.>"],
        30 * DAY,
        description="Every domain event; the history billing can be rebuilt from.",
    ),
    StreamSpec(
        subjects.STREAM_COMMANDS,
        [f"{subjects.COMMANDS}.>"],
        7 * DAY,
        description="Durable commands to one receiver (a node, the provisioner).",
    ),
    StreamSpec(
        subjects.STREAM_LOGS,
        [f"{subjects.LOGS}.>"],
        14 * DAY,
        duplicate_window_s=120,
        description="Worker stdout/stderr in chunks, read by `gpufleet job logs`.",
        # Jobs are untrusted and print what they like: their logs (each worker's capped by
        # its node, GPUFLEET_WORKER_LOG_MAX_BYTES) never take the file store the events
        # need (compose: 8 GB); past this the oldest chunks go first.
        max_bytes=LOGS_MAX_BYTES,
    ),
    StreamSpec(
        subjects.STREAM_DLQ,
        [f"{subjects.DLQ}.>"],
        90 * DAY,
        description="Messages a service refused, with the reason, kept for inspection.",
    ),
)


def stream_for(subject: str) -> str | None:
    for spec in STREAMS:
        prefix = spec.subjects[0].removesuffix(">")
        if subject.startswith(prefix):
            return spec.name
    return None


async def ensure_streams(js: JetStreamContext, replicas: int = 1, *, update: bool = False) -> None:
    """Create the streams that are missing. An existing stream is updated only with `update`
    (an operator: `just up`); a service may create a stream but not change one (its
    credential has no STREAM.UPDATE: a changed configuration could add subjects, shorten
    retention or seal the stream), so a difference is logged for an operator to apply.
    Streams refuse purges and message deletes: history is removed by age alone."""
    for spec in STREAMS:
        config = StreamConfig(
            name=spec.name,
            description=spec.description,
            subjects=spec.subjects,
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            max_age=spec.max_age_s,
            max_bytes=spec.max_bytes,
            duplicate_window=spec.duplicate_window_s,
            discard=DiscardPolicy.OLD,
            num_replicas=replicas,
            deny_delete=True,
            deny_purge=True,
        )
        try:
            info = await js.stream_info(spec.name)
        except NotFoundError:
            await js.add_stream(config)
            continue
        if update:
            await js.update_stream(config)
        elif _differs(info.config, config):
            log.warning(
                "stream %s differs from this release's configuration; an operator applies it "
                "(`just up` does)",
                spec.name,
            )


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
    keys = ("subjects", "max_age", "max_bytes", "duplicate_window", "deny_delete", "deny_purge")
    return any(getattr(have, k) != getattr(want, k) for k in keys)


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
