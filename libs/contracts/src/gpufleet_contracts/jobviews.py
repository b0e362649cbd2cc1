"""The scheduler's replies about jobs: what a user sees of a job, its workers and its logs."""

from __future__ import annotations

from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
)

from .spec import JobState


class JobAccepted(BaseModel):
    """The reply to `SubmitJob`: the job's id, its state and, while it waits, why."""

    model_config = ConfigDict(extra="allow")
    id: str
    state: JobState
    queue_reason: str | None = None
    queue_detail: list[dict[str, Any]] = Field(default_factory=list)


class HistoryEntry(BaseModel):
    state: str
    at: str | None = None  # ISO 8601, as stored
    reason: str | None = None


class JobNote(BaseModel):
    at: str | None = None
    note: str


class WorkerView(BaseModel):
    """One worker of a job as `gpufleet job show` reads it."""

    index: int
    state: str
    node: str | None = None  # its node's minion id
    node_id: str | None = None
    region: str | None = None
    gpu_model: str | None = None
    gpu_indices: list[int] | None = None
    gpu_fraction: str | None = None
    cpu_count: int | None = None  # a CPU-only worker's CPUs; its rate is then per CPU-hour
    rate: str | None = None
    charge: str | None = None
    started_at: str | None = None
    ended_at: str | None = None
    run_seconds: float | None = None
    exit_code: int | None = None
    reason: str | None = None
    attempts: int = 0  # placements it lost
    log_tail: str = ""
    # how far its sources are fetched, or its output put (the latest WorkerStaging's items)
    staging: list[dict[str, Any]] = Field(default_factory=list)
    # An endpoint's worker (serving.py): its URL while it holds its placement, its cold
    # start (phase -> seconds after it was placed) and what its node's proxy let through
    # (totals over its placements); None / empty for other job types.
    url: str | None = None
    cold_start: dict[str, float] = Field(default_factory=dict)
    requests: int | None = None
    errors: int | None = None
    bytes_in: int | None = None
    bytes_out: int | None = None


class JobView(BaseModel):
    """A job as the scheduler answers it (`get_job`, `cancel_job`, `list_jobs`): its spec with
    every env value "<secret>", its history and notes, its workers."""

    id: str
    name: str
    project: str
    owner: str
    creator: str
    state: str
    queue_reason: str | None = None
    queue_detail: list[dict[str, Any]] = Field(default_factory=list)
    # while starting or uploading: "downloading s3://b/train.tar: 1.2 of 4.0 GB, 95 MB/s"
    progress: str | None = None
    rate: str | list[str] | None = None  # one rate, or each of its workers' when they differ
    spec: dict[str, Any]
    history: list[HistoryEntry]
    notes: list[JobNote]
    workers: list[WorkerView]
    queued_at: str | None = None
    # An endpoint (R-JOB-6): the URL of its first worker that holds a placement on a node
    # with a proxy, that worker's cold start, and the requests and bytes of all its workers.
    url: str | None = None
    cold_start: dict[str, float] = Field(default_factory=dict)
    requests: int | None = None
    errors: int | None = None
    bytes_in: int | None = None
    bytes_out: int | None = None


class JobList(BaseModel):
    """The reply to `ListJobs` (the jobs the account owns or created) and to an operator's
    `ListAllJobs` (every account's: each job names its `owner` and `creator`), newest first."""

    jobs: list[JobView]


class LogChunk(BaseModel):
    subject: str
    worker: str
    seq: int  # its stream sequence
    time: str
    data: str  # base64


class JobLogs(BaseModel):
    """The reply to `GetJobLogs`: chunks after its cursor, node by node in the order the
    workers ran on them, each node's oldest first; `cursor` to ask for the next page (per
    node, the last sequence read of its stream; `last_seq`: the largest of them); `more`
    when some are left."""

    job_id: str
    chunks: list[LogChunk]
    last_seq: int
    more: bool
    cursor: dict[str, int] = Field(default_factory=dict)


class SchedulerSync(BaseModel):
    """Core NATS, between scheduler instances (subjects.SCHEDULER_SYNC): an instance that does
    not lead changed these jobs and nodes; the leader reads them again."""

    jobs: list[str] = Field(default_factory=list)
    nodes: list[str] = Field(default_factory=list)
