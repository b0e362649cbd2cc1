"""Endpoints (R-JOB-6) and notebooks (R-JOB-1) as the scheduler sees them: how a worker
serves (StartWorker's `Serving`), its URL on its node's proxy, and what its node says of it
(EndpointReady, EndpointMetered), kept on the worker's document and shown on the job.

Pure functions on a worker's document (jobdoc.py): `url` (from the node's proxy at
placement; the node's EndpointReady may restate it), `endpoint_phases` (phase -> when, as
the node saw them) and `metered` (per placement: its latest totals).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from gpufleet_contracts.clock import aware
from gpufleet_contracts.jobs import JobSpec, JobType, WorkerState
from gpufleet_contracts.serving import (
    NOTEBOOK_HEALTH_PATH,
    ROUTES_HEALTH_PATH,
    ColdStartPhase,
    EndpointMetered,
    EndpointReady,
    Serving,
    ServingKind,
)
from gpufleet_store import Doc

# A worker's URL is shown while it holds its placement (a finished one's is closed).
SERVES = (WorkerState.placed.value, WorkerState.running.value)
COUNTERS = ("requests", "errors", "bytes_in", "bytes_out")
# The job types whose workers are served at a URL on their node's proxy.
SERVED = frozenset({JobType.endpoint.value, JobType.notebook.value})


def serving_for(spec: JobSpec) -> Serving | None:
    """What an endpoint's or a notebook's worker serves and what its node's proxy probes;
    None for any other job type."""
    if spec.type is JobType.notebook:
        return Serving(kind=ServingKind.notebook, health_path=NOTEBOOK_HEALTH_PATH)
    endpoint = spec.endpoint
    if spec.type is not JobType.endpoint or endpoint is None:
        return None
    if endpoint.routes:
        return Serving(
            kind=ServingKind.routes, routes=list(endpoint.routes), health_path=ROUTES_HEALTH_PATH
        )
    return Serving(kind=ServingKind.server, health_path=endpoint.health_path or "/")


def url_of(proxy_url: str | None, job_id: str) -> str | None:
    """The job's URL on a node's proxy (`RegisterNode.proxy_url`, a template with `{job}`).
    A job id is already a DNS label ("j" and 12 hex digits, admission.py); lower-cased as
    host names compare. Replaced, not `str.format`: a template's other braces stay."""
    return None if proxy_url is None else proxy_url.replace("{job}", job_id.lower())


def ready(w: Doc, evt: EndpointReady) -> bool:
    """The worker answers through its node's proxy: its URL and cold-start phases, the
    latest report replacing the one before. False: nothing changed."""
    phases = {p.phase.value: p.at for p in evt.phases if p.phase is not ColdStartPhase.placed}
    if w.get("url") == evt.url and w.get("endpoint_phases") == phases:
        return False
    w["url"] = evt.url
    w["endpoint_phases"] = phases
    return True


def metered(w: Doc, evt: EndpointMetered) -> bool:
    """The totals a placement's proxy counted: the latest (by its time) replaces the one
    before, so a repeated or late report changes nothing. False: nothing changed."""
    kept: dict[str, Any] = dict(w.get("metered") or {})
    shown = kept.get(evt.placement_id)
    if shown is not None and aware(shown["at"]) >= aware(evt.at):
        return False
    kept[evt.placement_id] = {"at": evt.at, **{c: getattr(evt, c) for c in COUNTERS}}
    w["metered"] = kept
    return True


def url(w: Doc) -> str | None:
    return w.get("url") if w.get("state") in SERVES else None


def cold_start(w: Doc) -> dict[str, float]:
    """Phase -> seconds after the worker was placed (the scheduler's own time), in the order
    they ended (a node stages data before it builds the image: a model's requirements.txt
    goes into the image); empty until its node said it answers. A node's clock behind ours
    shows 0, not a negative time."""
    placed, phases = w.get("placed_at"), w.get("endpoint_phases") or {}
    if not isinstance(placed, datetime) or not phases:
        return {}
    out = {ColdStartPhase.placed.value: 0.0}
    for phase in ColdStartPhase:
        at = phases.get(phase.value)
        if isinstance(at, datetime):
            out[phase.value] = max(0.0, round((aware(at) - aware(placed)).total_seconds(), 3))
    return dict(sorted(out.items(), key=lambda kv: kv[1]))  # stable: ties keep the enum order


def totals(workers: list[Doc]) -> dict[str, int | None]:
    """Requests, 5xx answers and bytes of these workers, over all their placements; None
    when no proxy counted any."""
    counted = [m for w in workers for m in (w.get("metered") or {}).values()]
    if not counted:
        return dict.fromkeys(COUNTERS)
    return {c: sum(int(m.get(c) or 0) for m in counted) for c in COUNTERS}


def worker_view(w: Doc) -> Doc:
    """An endpoint worker's fields of WorkerView."""
    return {"url": url(w), "cold_start": cold_start(w), **totals([w])}


def job_view(workers: list[Doc]) -> Doc:
    """An endpoint's fields of JobView: the first serving worker's URL and that worker's
    cold start (else the first that has one), every worker's totals."""
    serving = [w for w in workers if url(w)]
    starts = [c for w in (serving or workers) if (c := cold_start(w))]
    return {
        "url": url(serving[0]) if serving else None,
        "cold_start": starts[0] if starts else {},
        **totals(workers),
    }


def awaiting_answer(workers: list[Doc]) -> bool:
    """An endpoint (or a notebook) whose running workers are served at a URL, none of which
    has answered through its node's proxy yet (no first_answer): users see it `starting`
    (issue 28: `running` only once its health route answers), while requests to its URL are
    held."""
    running = [w for w in workers if w.get("state") == WorkerState.running.value]
    return bool(running) and all(
        w.get("url") and ColdStartPhase.first_answer.value not in (w.get("endpoint_phases") or {})
        for w in running
    )


AWAITING = "its server started: waiting for its first answer (requests to its URL are held)"
