"""What must hold after any fault, read from the running system itself: the CLI, the
services' databases and the JetStream streams (not from what a test remembers doing).

Each function returns the violations it found (empty: the invariant holds), so a test
asserts on them and a chaos run counts them.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import nats
from gpufleet_contracts import subjects
from gpufleet_devstack.up import SERVICES

from .conftest import System

# The facts of one job that must be in the event history once it has run.
JOB_EVENTS = (
    "gpufleet.job.queued.v1",
    "gpufleet.worker.placed.v1",
    "gpufleet.worker.started.v1",
    "gpufleet.worker.finished.v1",
)


def charges_per_job(system: System) -> dict[str, int]:
    """How many ledger entries each job of `local` has (one per run, for its own node)."""
    entries = system.json("billing", "entries", "--limit", "1000")["entries"]
    return dict(Counter(str(e["job_id"]) for e in entries))


def gpus_given_twice(system: System, job_ids: list[str]) -> list[str]:
    """Pairs of workers of different jobs that held one GPU (of one node) at overlapping
    times."""
    spans = []
    for job_id in job_ids:
        for w in system.job(job_id)["workers"]:
            if w["started_at"] and w["ended_at"]:
                for gpu in w["gpu_indices"]:
                    spans.append((f"{w.get('node')}/{gpu}", w["started_at"], w["ended_at"], job_id))
    found = []
    for i, (gpu, start, end, job) in enumerate(spans):
        for gpu2, start2, end2, job2 in spans[i + 1 :]:
            if job != job2 and gpu == gpu2 and not (end <= start2 or end2 <= start):
                found.append(f"GPU {gpu}: {job} and {job2}")
    return found


def ledger_drift(system: System) -> list[str]:
    """Ledger groups (one charge's stages) whose entries do not sum to zero: a half-applied
    transaction would leave one; and the sum of every entry (balances drift from it)."""
    with system.mongo.client() as client:
        ledger = client["gpufleet_billing"]["ledger"]
        sums: Counter[str] = Counter()
        total = 0
        for e in ledger.find({}, {"group": 1, "stage": 1, "amount_micro": 1}):
            sums[f"{e['group']}/{e['stage']}"] += int(e["amount_micro"])
            total += int(e["amount_micro"])
    found = [f"{group} sums to {n}" for group, n in sums.items() if n]
    if total:
        found.append(f"all entries sum to {total}")
    return found


def ledger_keys(system: System) -> set[str]:
    with system.mongo.client() as client:
        return {str(d["_id"]) for d in client["gpufleet_billing"]["ledger"].find({}, {"_id": 1})}


def unpublished_outbox(system: System) -> dict[str, int]:
    """Outbox messages each service committed and has not yet had acknowledged."""
    found = {}
    with system.mongo.client() as client:
        for spec in SERVICES:
            db = client[f"gpufleet_{spec.name.replace('-', '_')}"]
            rows = db["outbox"].find({"published": False}, {"count": 1})
            n = sum(int(d.get("count", 1)) for d in rows)
            if n:
                found[spec.name] = n
    return found


def stream_events(system: System) -> list[tuple[str, str, dict[str, Any]]]:
    """(ce-id, ce-type, body) of every message of GPUFLEET_EVENTS, in stream order."""

    async def read() -> list[tuple[str, str, dict[str, Any]]]:
        servers = system.nats_url.split(",")
        nc = await nats.connect(servers=servers, connect_timeout=5, **system.nats.admin())
        try:
            js = nc.jetstream()
            state = (await js.stream_info(subjects.STREAM_EVENTS)).state
            out = []
            for seq in range(state.first_seq, state.last_seq + 1):
                msg = await js.get_msg(subjects.STREAM_EVENTS, seq)
                headers = msg.headers or {}
                body = json.loads(msg.data or b"{}")
                out.append((headers.get("ce-id", ""), headers.get("ce-type", ""), body))
            return out
        finally:
            await nc.close()

    return asyncio.run(read())


def history_gaps(system: System, job_ids: list[str]) -> list[str]:
    """Facts missing from the event history, duplicated message ids, and ledger entries whose
    event was never published (or published for an entry that is not in the ledger)."""
    events = stream_events(system)
    ids = Counter(e[0] for e in events)
    found = [f"message id {i} stored {n} times" for i, n in ids.items() if n > 1]
    seen = {(str(body.get("job_id")), type_) for _, type_, body in events}
    for job_id in job_ids:
        found += [f"{job_id}: no {t}" for t in JOB_EVENTS if (job_id, t) not in seen]
    published = {i for i, type_, _ in events if type_.startswith("gpufleet.billing.")}
    keys = ledger_keys(system)
    found += [f"ledger entry {k} never published" for k in sorted(keys - published)]
    found += [f"event {k} of no ledger entry" for k in sorted(published - keys)]
    return found
