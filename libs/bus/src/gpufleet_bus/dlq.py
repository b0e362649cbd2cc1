"""Reading dead letters back: the newest records of one DLQ subject, bounded.

A service answers `dead_letters` (ServiceRuntime) from the stream GPUFLEET_DLQ, filtered on
`gpufleet.v1.dlq.<service>.<account>` (or `.*`, every account, for an operator). Records
are published there by the dead-letter path (deadletter.py), which takes the account from
the subject the server let through, so the filter is the whole of the per-account rule.

The stream keeps 90 days of every service's and account's refusals, so reading a subject
from its start to keep the last `limit` would grow with the stream. Instead:

1. `pending(seq)`: a short-lived consumer filtered on the subject and starting at `seq`
   reports, at creation, how many of its messages lie at or after `seq`;
2. if the subject holds more than `limit`, the latest `seq` with `pending(seq) >= limit` is
   found by bisection over the stream's sequence range (about 30 probes for a billion
   messages);
3. one consumer reads from there: `limit` records, plus any published meanwhile.

Consumers are ephemeral (memory, no acks, deleted after use and gone after 10 s idle in
any case); a service's credential may create, read and delete them on this stream only
(gpufleet_auth.permissions).
"""

from __future__ import annotations

import contextlib
import json
from collections import deque
from typing import Any

from gpufleet_contracts import subjects
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

FETCH_BATCH = 256
_INACTIVE_S = 10.0


def _config(subject: str, start: int) -> ConsumerConfig:
    return ConsumerConfig(
        filter_subject=subject,
        deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
        opt_start_seq=start,
        ack_policy=AckPolicy.NONE,
        mem_storage=True,
        inactive_threshold=_INACTIVE_S,
    )


async def _pending(js: JetStreamContext, subject: str, start: int) -> int:
    """How many messages on `subject` lie at or after sequence `start`."""
    info = await js.add_consumer(subjects.STREAM_DLQ, _config(subject, start))
    with contextlib.suppress(Exception):  # it goes away when idle anyway
        await js.delete_consumer(subjects.STREAM_DLQ, info.name)
    return int(info.num_pending or 0)


async def _start(js: JetStreamContext, subject: str, limit: int) -> int | None:
    """The sequence to read from to get the last `limit` messages of `subject`, or None
    when the stream holds none."""
    try:
        info = await js.stream_info(subjects.STREAM_DLQ)
    except NotFoundError:
        return None
    first, last = int(info.state.first_seq or 0), int(info.state.last_seq or 0)
    if not info.state.messages or last < first or first < 1:
        return None
    total = await _pending(js, subject, first)
    if total == 0:
        return None
    if total <= limit:
        return first
    lo, hi = first, last  # pending(lo) >= limit; find the largest such sequence
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if await _pending(js, subject, mid) >= limit:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _record(data: bytes, seq: int) -> dict[str, Any]:
    try:
        body = json.loads(data)
    except ValueError:
        body = {"payload": None, "errors": [{"error": "the record is not JSON"}]}
    if not isinstance(body, dict):
        body = {"payload": body}
    return {"seq": seq, **body}


async def read_dead_letters(js: JetStreamContext, subject: str, limit: int) -> list[dict[str, Any]]:
    """The newest `limit` records on `subject` (wildcards allowed), newest first, each with
    its stream sequence `seq`."""
    start = await _start(js, subject, limit)
    if start is None:
        return []
    info = await js.add_consumer(subjects.STREAM_DLQ, _config(subject, start))
    sub = await js.pull_subscribe_bind(info.name, stream=subjects.STREAM_DLQ)
    kept: deque[dict[str, Any]] = deque(maxlen=limit)
    try:
        pending = int(info.num_pending or 0)
        # Published meanwhile: read them too, up to as many again (the newest are kept).
        budget = pending + limit
        while pending > 0 and budget > 0:
            try:
                msgs = await sub.fetch(min(pending, FETCH_BATCH, budget), timeout=2.0)
            except TimeoutError:
                break
            for m in msgs:
                kept.append(_record(m.data, int(m.metadata.sequence.stream)))
                pending = int(m.metadata.num_pending)
                budget -= 1
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
        with contextlib.suppress(Exception):
            await js.delete_consumer(subjects.STREAM_DLQ, info.name)
    return list(reversed(kept))
