"""The scheduler's job documents: how one is made, copied, shown, and what its parts mean.

Pure functions on plain dicts (the documents of the `jobs` collection), no I/O: the service
(state.py and its parts) read and write them in its transactions.

A job's request (its `spec`, `req` and sealed env values, R-JOB-7) is written and read by
jobrequest.py alone; `view` (every reply) shows the env names with "<secret>" values.
"""

from __future__ import annotations

import logging
from datetime import datetime
from decimal import Decimal
from typing import Any, cast

from gpufleet_contracts.catalog import catalog
from gpufleet_contracts.jobs import JobSpec, JobState, WorkerState
from gpufleet_store import Doc, SecretBox, now_ms

from . import jobrequest, progress, serving
from .jobstate import job_state

log = logging.getLogger("gpufleet.scheduler")


def new_job(
    job_id: str,
    spec: JobSpec,
    account: str,
    now: datetime,
    request_id: str | None,
    *,
    owner: str | None = None,
    project: str | None = None,
    box: SecretBox | None = None,
) -> Doc:
    """A submitted job's document: queued, every worker waiting, its secrets sealed.
    `account` created it; `owner` owns its project (`project`, its name there), the account
    itself by default."""
    project = project or spec.project
    doc: Doc = {
        "_id": job_id,
        "name": spec.name,
        "project": project,
        "owner": owner or account,  # the project's owner: who pays (R-TEN-1, R-BILL-1)
        "creator": account,  # != owner: a federated job (R-BILL-2)
        **jobrequest.encode(spec, project, box),  # spec, req, env_sealed
        "state": JobState.queued.value,
        "history": [{"state": JobState.queued.value, "at": now, "reason": None}],
        "notes": [],
        "queue_reason": "not yet considered",
        "queue_detail": [],
        "queued_at": now,
        "queued_ms": now_ms(now),
        "updated_at": now,
        "version": 0,
        "cancel_requested": False,
        "request_id": request_id,
        "workers": [
            {"index": i, "state": WorkerState.waiting.value, "attempts": []}
            for i in range(spec.workers)
        ],
    }
    return doc


def held_slots(w: Doc) -> list[tuple[int, int]]:
    """(GPU, share) a placed worker holds; a worker placed before claims were recorded per
    share holds its whole GPUs."""
    claims = w.get("claims") or [[g, 0] for g in w.get("gpu_indices") or []]
    return [(int(g), int(sh)) for g, sh in claims]


def attempt(w: Doc, reason: str, at: datetime) -> Doc:
    """The record a worker keeps of a placement it lost (`attempts`)."""
    return {k: w.get(k) for k in ("placement_id", "minion_id", "started_at")} | {
        "reason": reason,
        "ended_at": at,
    }


def copy_job(job: Doc) -> Doc:
    """A copy a transaction may change (workers and history are; the rest is replaced)."""
    out = dict(job)
    out["workers"] = [dict(w) for w in job["workers"]]
    out["history"] = list(job["history"])
    return out


def share_memory(model: str | None, memory_mb: int | None, fraction: Decimal | None) -> int | None:
    if fraction is None:
        return None
    total = memory_mb or (
        catalog().gpus[model].memory_gb * 1024 if model in catalog().gpus else None
    )
    return None if total is None else int(total * fraction)


def iso(v: Any) -> str | None:
    if isinstance(v, datetime):
        return v.isoformat()
    return None if v is None else str(v)


def seconds(a: Any, b: Any) -> float | None:
    if isinstance(a, datetime) and isinstance(b, datetime):
        return round((b - a).total_seconds(), 3)
    return None


# What a placement adds to a worker, dropped when the worker waits again.
PLACEMENT_KEYS = (
    "placement_id",
    "node_id",
    "minion_id",
    "region",
    "gpu_model",
    "gpu_indices",
    "claims",
    "gpu_fraction",
    "cpu_count",
    "rate",
    "rate_per_gpu_hour",
    "charge",
    "placed_at",
    "started_at",
    "epoch",
    "url",  # an endpoint's or notebook's, on its node's proxy (serving.py)
    "endpoint_phases",
)


def view(job: Doc) -> Doc:
    """A job as requests answer it (`gpufleet job show`, contracts' JobView): no internal
    fields."""
    rates = {w.get("rate") for w in job["workers"] if w.get("rate")}
    state, progress = job["state"], job_progress(job)
    served = (job.get("req") or job.get("spec") or {}).get("type") in serving.SERVED
    if state == JobState.running.value and served and serving.awaiting_answer(job["workers"]):
        state, progress = JobState.starting.value, serving.AWAITING  # not answering yet
    return {
        "id": job["_id"],
        "name": job["name"],
        "project": job["project"],
        "owner": job["owner"],
        "creator": job["creator"],
        "state": state,
        "queue_reason": job.get("queue_reason"),
        "queue_detail": job.get("queue_detail") or [],
        "rate": rates.pop() if len(rates) == 1 else (sorted(rates) or None),
        "spec": jobrequest.shown_spec(job["spec"]),
        "history": [
            {"state": h["state"], "at": iso(h["at"]), "reason": h.get("reason")}
            for h in job["history"]
        ],
        "notes": [{"at": iso(n["at"]), "note": n["note"]} for n in job.get("notes") or []],
        "workers": [
            {
                "index": w["index"],
                "state": w["state"],
                "node": w.get("minion_id"),
                "node_id": w.get("node_id"),
                "region": w.get("region"),
                "gpu_model": w.get("gpu_model"),
                "gpu_indices": w.get("gpu_indices"),
                "gpu_fraction": w.get("gpu_fraction"),
                "cpu_count": w.get("cpu_count"),
                "rate": w.get("rate"),
                "charge": w.get("charge"),
                "started_at": iso(w.get("started_at")),
                "ended_at": iso(w.get("ended_at")),
                "run_seconds": seconds(w.get("started_at"), w.get("ended_at")),
                "exit_code": w.get("exit_code"),
                "reason": w.get("reason"),
                "attempts": len(w.get("attempts") or []),
                "log_tail": w.get("log_tail", ""),
                "staging": w.get("staging") or [],
                **serving.worker_view(w),
            }
            for w in job["workers"]
        ],
        "progress": progress,
        "queued_at": iso(job["queued_at"]),
        **serving.job_view(job["workers"]),
    }


def job_progress(job: Doc) -> str | None:
    """While a job is starting (its sources fetched) or uploading (its output put): how far,
    from its workers' latest staging reports (reports.py), one line per worker that has one."""
    if job["state"] not in (JobState.starting.value, JobState.uploading.value):
        return None
    lines = []
    for w in job["workers"]:
        said = progress.text(w.get("staging") or [])
        if said:
            lines.append(said if len(job["workers"]) == 1 else f"worker {w['index']}: {said}")
    return "; ".join(lines) or None


def find_worker(job: Doc | None, index: int, placement_id: str) -> Doc | None:
    """The worker of `job` that holds this placement (None: an event of an older one)."""
    if job is None:
        return None
    for w in job["workers"]:
        if w["index"] == index and w.get("placement_id") == placement_id:
            return cast(Doc, w)
    return None


def record_state(job: Doc, at: datetime, reason: str | None) -> JobState | None:
    """Recompute the job's state from its workers; append to history if it changed."""
    new = job_state(
        (WorkerState(w["state"]) for w in job["workers"]), job.get("cancel_requested", False)
    )
    if new.value == job["state"]:
        return None
    previous = job["state"]
    job["state"] = new.value
    job["history"].append({"state": new.value, "at": at, "reason": reason})
    return JobState(previous)


def reported_by_its_node(worker: Doc, minion_id: str) -> bool:
    """A worker fact counts only from the node its placement named (the subject carries the
    reporting node and only that node may publish there: gpufleet_auth.permissions)."""
    if worker.get("minion_id") == minion_id:
        return True
    log.warning(
        "worker %s reported by node %s, placed on %s: ignored",
        worker.get("placement_id"),
        minion_id,
        worker.get("minion_id"),
    )
    return False
