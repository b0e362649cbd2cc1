"""A job's worker logs, read from GPUFLEET_LOGS for the account that may see the job.

Users have no JetStream rights (gpufleet_auth.permissions): they ask the scheduler, which
checks the job is theirs and reads the stream. A chunk counts only if it came from a node
the worker was placed on: logs are published on `gpufleet.v1.log.<minion_id>.<job>.<worker>`
and only that node may publish there, so another node cannot write into this job's log.
"""

from __future__ import annotations

import base64
import contextlib

from gpufleet_contracts import subjects
from gpufleet_store import Doc
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy


def nodes_of(job: Doc) -> dict[str, set[str]]:
    """worker number -> the minion ids it was placed on."""
    out: dict[str, set[str]] = {}
    for w in job.get("workers") or []:
        ran = set(w.get("ran_on") or ())
        if w.get("minion_id"):
            ran.add(str(w["minion_id"]))
        out[str(w.get("index"))] = ran
    return out


async def read_logs(
    js: JetStreamContext, job: Doc, after: int, limit: int, inbox_prefix: bytes
) -> Doc:
    """Up to `limit` chunks after stream sequence `after`, oldest first."""
    allowed = nodes_of(job)
    config = ConsumerConfig(
        ack_policy=AckPolicy.NONE,
        inactive_threshold=30.0,
        mem_storage=True,
        deliver_policy=DeliverPolicy.BY_START_SEQUENCE if after else DeliverPolicy.ALL,
        opt_start_seq=after + 1 if after else None,
    )
    filter_subject = f"{subjects.LOGS}.*.{job['_id']}.*"
    sub = await js.pull_subscribe(
        filter_subject, stream=subjects.STREAM_LOGS, config=config, inbox_prefix=inbox_prefix
    )
    chunks: list[Doc] = []
    last = after
    try:
        pending = int((await sub.consumer_info()).num_pending or 0)
        while pending > 0 and len(chunks) < limit:
            try:
                msgs = await sub.fetch(min(pending, limit - len(chunks)), timeout=5.0)
            except TimeoutError:
                break
            for m in msgs:
                pending = int(m.metadata.num_pending)
                last = int(m.metadata.sequence.stream)
                _, _, minion, _, worker = m.subject.rsplit(".", 4)
                if minion not in allowed.get(worker, set()):
                    continue  # not from a node this worker ran on
                chunks.append(
                    {
                        "subject": m.subject,
                        "worker": worker,
                        "seq": last,
                        "time": m.metadata.timestamp.isoformat(),
                        "data": base64.b64encode(m.data).decode(),
                    }
                )
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
    return {"job_id": job["_id"], "chunks": chunks, "last_seq": last, "more": pending > 0}
