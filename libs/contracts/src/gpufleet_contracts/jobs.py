"""Job commands and events (PRODUCT.md section 6)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from . import subjects
from .base import Command, Event
from .catalog import catalog
from .errors import rule, ruled


class JobType(StrEnum):
    notebook = "notebook"
    training = "training"
    inference = "inference"
    endpoint = "endpoint"


class JobState(StrEnum):
    """R-JOB-8. `queued` is shown to users as "waiting for GPUs"."""

    queued = "queued"
    starting = "starting"
    running = "running"
    uploading = "uploading"
    finished = "finished"
    failed = "failed"
    stopped = "stopped"

    @property
    def terminal(self) -> bool:
        return self in (JobState.finished, JobState.failed, JobState.stopped)


class WorkerState(StrEnum):
    waiting = "waiting"  # no GPUs yet; costs nothing (R-JOB-5)
    placed = "placed"  # GPUs reserved, the node was told to start it
    running = "running"
    finished = "finished"
    failed = "failed"
    stopped = "stopped"

    @property
    def terminal(self) -> bool:
        return self in (WorkerState.finished, WorkerState.failed, WorkerState.stopped)


Money = Annotated[Decimal, Field(max_digits=18, decimal_places=6)]


@ruled
class JobSpec(BaseModel):
    """What a user asks for. Every path into gpufleet (CLI flags, file, event) validates this."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9 _.\-]*$",
        json_schema_extra=rule("R-JOB-2", **{"x-valid": "1-128 letters, digits, space, _ . -"}),
    )
    type: JobType = Field(default=JobType.training, json_schema_extra=rule("R-JOB-1"))
    project: str = Field(default="default", min_length=1, max_length=64)
    gpu_types: list[str] = Field(min_length=1, json_schema_extra=rule("R-JOB-2"))
    gpu_count: int = Field(
        default=1,
        ge=0,
        le=16,
        json_schema_extra=rule("R-JOB-2", **{"x-valid": "0..16 GPUs per worker"}),
    )
    cpu_count: int | None = Field(default=None, ge=4, le=256, json_schema_extra=rule("R-JOB-2"))
    max_price: Money | None = Field(
        default=None,
        ge=0,
        json_schema_extra=rule("R-JOB-2", **{"x-valid": "credits per GPU-hour, >= 0"}),
    )
    disk_size_gb: int = Field(
        default=10,
        ge=10,
        le=1000,
        json_schema_extra=rule("R-JOB-2", **{"x-valid": "10..1000 GB per worker"}),
    )
    workers: int = Field(default=1, ge=1, le=64, json_schema_extra=rule("R-JOB-5"))
    command: list[str] = Field(min_length=1, json_schema_extra=rule("R-JOB-5"))
    env: dict[str, str] = Field(default_factory=dict, json_schema_extra=rule("R-JOB-7"))

    @field_validator("gpu_types")
    @classmethod
    def _known_gpu_types(cls, value: list[str]) -> list[str]:
        known = catalog().model_names()
        unknown = [t for t in value if t not in known]
        if unknown:
            raise PydanticCustomError(
                "unknown_gpu_type",
                "unknown GPU type(s): {unknown}",
                {"unknown": ", ".join(unknown), "rule": "R-JOB-2", "valid": ", ".join(known)},
            )
        return list(dict.fromkeys(value))

    @field_validator("cpu_count")
    @classmethod
    def _cpu_multiple_of_4(cls, value: int | None) -> int | None:
        if value is not None and value % 4:
            raise PydanticCustomError(
                "cpu_count_multiple",
                "cpu_count must be a multiple of 4, got {value}",
                {"value": value, "rule": "R-JOB-2", "valid": "4, 8, 12, ..."},
            )
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        import re

        bad = [k for k in value if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)]
        if bad:
            raise PydanticCustomError(
                "env_name",
                "invalid environment variable name(s): {bad}",
                {"bad": ", ".join(bad), "rule": "R-JOB-7", "valid": "[A-Za-z_][A-Za-z0-9_]*"},
            )
        return value

    @model_validator(mode="after")
    def _gpus_or_cpus(self) -> JobSpec:
        if self.gpu_count == 0 and self.cpu_count is None:
            raise PydanticCustomError(
                "no_resources",
                "a job needs gpu_count >= 1, or cpu_count for a CPU-only job",
                {"rule": "R-JOB-2", "valid": "gpu_count >= 1 or cpu_count"},
            )
        return self


# --- commands -------------------------------------------------------------------------


class SubmitJob(Command):
    """Request (core NATS) to the scheduler. The acting account comes from the connection."""

    TYPE = "gpufleet.job.submit.v1"
    SUBJECT = subjects.rpc("scheduler", "submit_job")
    spec: JobSpec


class CancelJob(Command):
    TYPE = "gpufleet.job.cancel.v1"
    SUBJECT = subjects.rpc("scheduler", "cancel_job")
    job_id: str


class StartWorker(Command):
    """Durable command to one node: run this worker on exactly these GPUs."""

    TYPE = "gpufleet.node.start_worker.v1"
    SUBJECT = subjects.command("node", "start_worker")
    minion_id: str
    job_id: str
    job_name: str
    worker: int
    command: list[str]
    env: dict[str, str] = Field(default_factory=dict)
    gpu_indices: list[int]
    gpu_uuids: list[str] = Field(default_factory=list)
    placement_id: str  # unique per placement; a re-placed worker gets a new one


class StopWorker(Command):
    TYPE = "gpufleet.node.stop_worker.v1"
    SUBJECT = subjects.command("node", "stop_worker")
    minion_id: str
    job_id: str
    worker: int
    placement_id: str
    reason: str


# --- events ---------------------------------------------------------------------------


class JobQueued(Event):
    TYPE = "gpufleet.job.queued.v1"
    SUBJECT = subjects.event("job", "queued")
    job_id: str
    owner: str
    creator: str
    spec: JobSpec
    queued_at: datetime


class JobStateChanged(Event):
    TYPE = "gpufleet.job.state_changed.v1"
    SUBJECT = subjects.event("job", "state_changed")
    job_id: str
    state: JobState
    previous: JobState | None = None
    reason: str | None = None
    at: datetime


class WorkerPlaced(Event):
    """GPUs reserved for one worker and its rate locked (R-SCHED-2)."""

    TYPE = "gpufleet.worker.placed.v1"
    SUBJECT = subjects.event("worker", "placed")
    job_id: str
    worker: int
    placement_id: str
    node_id: str
    minion_id: str
    region: str
    gpu_model: str
    gpu_indices: list[int]
    gpu_count: int
    rate: Money  # credits per GPU-hour, locked
    charge: str  # "usage" (owner's own node, R-BILL-1) or "market" (another account's node)
    payer: str  # the project owner
    node_owner: str
    placed_at: datetime
    creator: str = ""  # the account that submitted the job; != payer for federated jobs
    job_type: JobType = JobType.training


class WorkerStarted(Event):
    TYPE = "gpufleet.worker.started.v1"
    SUBJECT = subjects.event("worker", "started")
    job_id: str
    worker: int
    placement_id: str
    minion_id: str
    pid: int | None = None
    started_at: datetime


class WorkerFinished(Event):
    """A worker ended: `finished` (exit 0), `failed` (non-zero exit or lost) or `stopped`."""

    TYPE = "gpufleet.worker.finished.v1"
    SUBJECT = subjects.event("worker", "finished")
    job_id: str
    worker: int
    placement_id: str
    minion_id: str
    state: WorkerState
    exit_code: int | None = None
    reason: str | None = None
    started_at: datetime | None = None
    ended_at: datetime
    log_tail: str = ""


# --- replies --------------------------------------------------------------------------


class JobAccepted(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str
    state: JobState


def spec_from_mapping(data: dict[str, Any]) -> JobSpec:
    return JobSpec.model_validate(data)


class GetJob(Command):
    TYPE = "gpufleet.job.get.v1"
    SUBJECT = subjects.rpc("scheduler", "get_job")
    job_id: str


class ListJobs(Command):
    TYPE = "gpufleet.job.list.v1"
    SUBJECT = subjects.rpc("scheduler", "list_jobs")
    limit: int = Field(default=100, ge=1, le=1000)


class Demand(BaseModel):
    """One waiting worker that no node can take now."""

    model_config = ConfigDict(frozen=True, extra="allow")

    job_id: str
    worker: int
    owner: str
    project: str
    gpu_types: list[str]
    gpu_count: int
    max_price: Money | None = None
    region: str | None = None  # pinned region (R-RES-1), if any
    burst_allowed: bool = False  # the project allows bursting to the cloud (R-SCHED-3)
    waiting_since: datetime


class PendingDemandChanged(Event):
    """The scheduler's unplaceable work changed: what the provisioner may burst for."""

    TYPE = "gpufleet.scheduler.pending_demand_changed.v1"
    SUBJECT = subjects.event("scheduler", "pending_demand_changed")
    demands: list[Demand]
    at: datetime
