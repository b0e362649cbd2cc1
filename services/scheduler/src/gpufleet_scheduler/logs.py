"""A job's worker logs, read for the account that may see the job from the log stream of
each node its workers ran on.

Users have no JetStream rights (gpufleet_auth.permissions): they ask the scheduler, which
checks the job is theirs and reads the streams. Every node keeps its logs in a stream of
its own (`subjects.node_logs_stream`, made by the provisioner when it enrols), so what a
node writes is bounded by that stream's limits and pushes out only its own older output.
A chunk counts only if it came from a node the worker was placed on: logs are published on
`gpufleet.v1.log.<minion_id>.<job>.<worker>` and only that node may publish there, so
another node cannot write into this job's log.

A page goes through the job's nodes in the order its workers ran on them, each from the
sequence its cursor names (the last one read of that node's stream), and says where to go
on from (`cursor`). A node removed since has no stream left: its chunks are gone (each
finished worker keeps its last 4000 characters, `log_tail`).
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Mapping

from gpufleet_contracts import subjects
from gpufleet_store import Doc
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError


def nodes_of(job: Doc) -> dict[str, set[str]]:
    """worker number -> the minion ids it was placed on."""
    out: dict[str, set[str]] = {}
    for w in job.get("workers") or []:
        ran = set(w.get("ran_on") or ())
        if w.get("minion_id"):
            ran.add(str(w["minion_id"]))
        out[str(w.get("index"))] = ran
    return out


def node_order(job: Doc) -> list[str]:
    """The job's nodes, in the order its workers ran on them (earlier attempts first)."""
    out: list[str] = []
    for w in job.get("workers") or []:
        ran = [a.get("minion_id") for a in w.get("attempts") or []]
        for minion in [*ran, *(w.get("ran_on") or ()), w.get("minion_id")]:
            if minion and str(minion) not in out:
                out.append(str(minion))
    return out


async def read_logs(
    js: JetStreamContext,
    job: Doc,
    after: int,
    limit: int,
    inbox_prefix: bytes,
    cursor: Mapping[str, int] | None = None,
) -> Doc:
    """Up to `limit` chunks after the cursor (per node; `after` for a node it does not
    name), node by node, each node's oldest first."""
    allowed = nodes_of(job)
    at = {m: int((cursor or {}).get(m, after)) for m in node_order(job)}
    chunks: list[Doc] = []
    more = False
    for minion in at:
        if len(chunks) >= limit:
            more = True
            break
        left = limit - len(chunks)
        pending = await _read_node(js, job, minion, at, left, chunks, allowed, inbox_prefix)
        more = more or pending > 0
    return {
        "job_id": job["_id"],
        "chunks": chunks,
        "last_seq": max(at.values(), default=after),
        "more": more,
        "cursor": at,
    }


async def _read_node(
    js: JetStreamContext,
    job: Doc,
    minion: str,
    at: dict[str, int],
    limit: int,
    chunks: list[Doc],
    allowed: dict[str, set[str]],
    inbox_prefix: bytes,
) -> int:
    """Read up to `limit` of the job's chunks from `minion`'s stream into `chunks`, moving
    `at[minion]`; how many are left there."""
    start = at[minion]
    config = ConsumerConfig(
        ack_policy=AckPolicy.NONE,
        inactive_threshold=30.0,
        mem_storage=True,
        deliver_policy=DeliverPolicy.BY_START_SEQUENCE if start else DeliverPolicy.ALL,
        opt_start_seq=start + 1 if start else None,
    )
    try:
        sub = await js.pull_subscribe(
            f"{subjects.LOGS}.{minion}.{job['_id']}.*",
            stream=subjects.node_logs_stream(minion),
            config=config,
            inbox_prefix=inbox_prefix,
        )
    except NotFoundError:
        return 0  # the node is gone, and its logs with it
    pending = 0
    try:
        pending = int((await sub.consumer_info()).num_pending or 0)
        while pending > 0 and limit > 0:
            try:
                msgs = await sub.fetch(min(pending, limit), timeout=5.0)
            except TimeoutError:
                break
            for m in msgs:
                pending = int(m.metadata.num_pending)
                at[minion] = int(m.metadata.sequence.stream)
                worker = m.subject.rsplit(".", 1)[-1]
                if minion not in allowed.get(worker, set()):
                    continue  # not from a node this worker ran on
                limit -= 1
                chunks.append(
                    {
                        "subject": m.subject,
                        "worker": worker,
                        "seq": at[minion],
                        "time": m.metadata.timestamp.isoformat(),
                        "data": base64.b64encode(m.data).decode(),
                    }
                )
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
    return pending
