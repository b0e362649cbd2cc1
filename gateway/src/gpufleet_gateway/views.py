"""What the console's pages show, built from the services' replies (pure: no I/O).

The fleet groups nodes by region with each node's last heartbeat (CPU, RAM, disk, each GPU);
the queue numbers the waiting jobs in the order they were queued (the scheduler places the
oldest first within what fits), with each one's reason and when it was queued. How long it has
waited is counted in the browser from that time: a view holds nothing derived from now, so the
live stream sends a queue again only when it changed.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from gpufleet_contracts.jobviews import JobLogs, JobView
from gpufleet_contracts.nodes import NodeView
from pydantic import BaseModel

RUNNING = frozenset({"starting", "running", "uploading"})
LATEST = datetime.max.replace(tzinfo=UTC)
LOG_TAIL_CHARS = 8000


class GpuNow(BaseModel):
    index: int
    utilization_pct: int | None = None
    memory_used_mb: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None


class NodeRow(BaseModel):
    node_id: str
    minion_id: str
    name: str
    region: str
    owner: str
    state: str
    kind: str
    gpu_models: list[str]
    simulated: bool
    last_seen: str | None
    cpu_pct: float | None = None
    ram_used_mb: int | None = None
    disk_used_pct: float | None = None
    disk_free_gb: float | None = None
    gpus: list[GpuNow]
    running: list[str]


class RegionGroup(BaseModel):
    region: str
    owners: list[str]
    nodes: list[NodeRow]
    gpus: int
    gpu_utilization_pct: float | None  # the mean over its GPUs that reported one


class Fleet(BaseModel):
    regions: list[RegionGroup]
    nodes: int
    gpus: int


class QueueRow(BaseModel):
    position: int
    id: str
    name: str
    owner: str
    reason: str | None
    detail: list[dict[str, Any]]
    queued_at: str | None  # ISO 8601 with its offset (a stored time without one is UTC)


class RunningRow(BaseModel):
    id: str
    name: str
    owner: str
    state: str
    nodes: list[str]
    started_at: str | None
    rate: str | list[str] | None


class Queue(BaseModel):
    queued: list[QueueRow]
    running: list[RunningRow]
    recent: list[RunningRow]  # ended, newest first


class JobPage(BaseModel):
    job: JobView
    log_tail: str
    log_truncated: bool


def _when(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        at = datetime.fromisoformat(value)
    except ValueError:
        return None
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def node_row(node: NodeView) -> NodeRow:
    t = node.telemetry or {}
    gpus = [
        GpuNow.model_validate({k: g.get(k) for k in GpuNow.model_fields})
        for g in t.get("gpus") or []
        if isinstance(g, dict) and isinstance(g.get("index"), int)
    ]
    return NodeRow(
        node_id=node.node_id,
        minion_id=node.minion_id,
        name=node.name,
        region=node.region,
        owner=node.owner,
        state=str(node.state),
        kind=node.kind,
        gpu_models=[g.model or "GPU" for g in node.gpus],
        simulated=node.simulated,
        last_seen=node.last_seen,
        cpu_pct=t.get("cpu_pct"),
        ram_used_mb=t.get("ram_used_mb"),
        disk_used_pct=t.get("disk_used_pct"),
        disk_free_gb=t.get("disk_free_gb"),
        gpus=gpus,
        running=[str(r) for r in t.get("running") or []],
    )


def fleet(nodes: Iterable[NodeView], region: str | None = None, node: str | None = None) -> Fleet:
    """Every node by region; `region` keeps one region, `node` one node (its name, minion id
    or node id)."""
    rows = [node_row(n) for n in nodes]
    if region:
        rows = [r for r in rows if r.region == region]
    if node:
        rows = [r for r in rows if node in (r.name, r.minion_id, r.node_id)]
    groups: dict[str, list[NodeRow]] = {}
    for r in sorted(rows, key=lambda r: (r.region, r.owner, r.name)):
        groups.setdefault(r.region, []).append(r)
    regions = []
    for name, members in sorted(groups.items()):
        utils = [
            g.utilization_pct for r in members for g in r.gpus if g.utilization_pct is not None
        ]
        regions.append(
            RegionGroup(
                region=name,
                owners=sorted({r.owner for r in members}),
                nodes=members,
                gpus=sum(len(r.gpu_models) for r in members),
                gpu_utilization_pct=round(sum(utils) / len(utils), 1) if utils else None,
            )
        )
    return Fleet(regions=regions, nodes=len(rows), gpus=sum(len(r.gpu_models) for r in rows))


def _running_row(job: JobView) -> RunningRow:
    return RunningRow(
        id=job.id,
        name=job.name,
        owner=job.owner,
        state=job.state,
        nodes=sorted({w.node for w in job.workers if w.node}),
        started_at=min((w.started_at for w in job.workers if w.started_at), default=None),
        rate=job.rate,
    )


def queue(jobs: Iterable[JobView], recent: int = 20) -> Queue:
    """The waiting jobs numbered from the oldest queued (a stable order: rows do not jump on
    refresh; one without a time last), the running ones, and the latest ended."""
    listed = list(jobs)
    waiting = sorted(
        (j for j in listed if j.state == "queued"),
        key=lambda j: (_when(j.queued_at) or LATEST, j.id),
    )
    rows = []
    for position, job in enumerate(waiting, start=1):
        queued = _when(job.queued_at)
        rows.append(
            QueueRow(
                position=position,
                id=job.id,
                name=job.name,
                owner=job.owner,
                reason=job.queue_reason,
                detail=job.queue_detail,
                queued_at=queued.isoformat() if queued else job.queued_at,
            )
        )
    running = [_running_row(j) for j in listed if j.state in RUNNING]
    ended = [_running_row(j) for j in listed if j.state not in RUNNING and j.state != "queued"]
    return Queue(queued=rows, running=running, recent=ended[:recent])


def job_page(job: JobView, logs: JobLogs | None) -> JobPage:
    """A job with the tail of its workers' output (the last LOG_TAIL_CHARS)."""
    text = ""
    if logs is not None:
        text = "".join(
            base64.b64decode(c.data).decode("utf-8", errors="replace") for c in logs.chunks
        )
    if not text:
        text = "".join(w.log_tail for w in job.workers)
    return JobPage(
        job=job, log_tail=text[-LOG_TAIL_CHARS:], log_truncated=len(text) > LOG_TAIL_CHARS
    )
