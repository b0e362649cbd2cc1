"""Job commands and events (PRODUCT.md section 6)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from . import limits, subjects
from .base import Command, Event
from .endpoints import Reservation
from .errors import ErrorBody
from .fields import Argv, Cap, EnvValue, Int, Name
from .images import RegistryAuth
from .jobspec import BaseEnvironment, Packages
from .jobviews import HistoryEntry as HistoryEntry
from .jobviews import JobAccepted as JobAccepted
from .jobviews import JobList as JobList
from .jobviews import JobLogs as JobLogs
from .jobviews import JobNote as JobNote
from .jobviews import JobView as JobView
from .jobviews import LogChunk as LogChunk
from .jobviews import SchedulerSync as SchedulerSync
from .jobviews import WorkerView as WorkerView
from .locations import OutputTarget, Source, legacy_source, legacy_target
from .serving import Serving
from .spec import MAX_PINNED as MAX_PINNED
from .spec import JobSpec as JobSpec
from .states import JobState as JobState
from .states import JobType as JobType
from .states import Money as Money
from .states import WorkerState as WorkerState

# --- commands -------------------------------------------------------------------------


class SubmitJob(Command):
    """Request (core NATS) to the scheduler. The acting account comes from the connection.

    With `request_id` the submission is idempotent for its account, as EnqueueJob is: the
    job id is derived from the account and `request_id`, and the same request sent again
    (a client that heard no answer and asks again, maybe another scheduler instance) gets
    the job the first one queued, never a second job. The CLI sends one with every submit.
    """

    TYPE = "gpufleet.job.submit.v1"
    SUBJECT = subjects.rpc("scheduler", "submit_job")
    REPLY = JobAccepted
    spec: JobSpec
    request_id: Name | None = Field(default=None, min_length=1, max_length=128)


class EnqueueJob(Command):
    """Durable command (JetStream) from another system: validate and queue a job.

    The same validation as `SubmitJob`. The outcome is an event: `JobQueued` carrying this
    `request_id`, or `JobRejected`; a body that does not validate is dead-lettered with its
    field errors (stream GPUFLEET_DLQ). The job id is derived from the account and
    `request_id`, so a redelivered or re-sent command never queues a second job.
    The acting account is the subject's `<account>` token, which only that account's
    credentials may publish (gpufleet_auth.permissions). Like every command, it must carry
    the CloudEvents headers `ce-specversion` (1.0), `ce-id`, `ce-source` and `ce-type`
    (this TYPE): one without them, or of another type, is dead-lettered, never run.
    """

    TYPE = "gpufleet.job.enqueue.v1"
    SUBJECT = subjects.command("scheduler", "enqueue_job", key="{account}")
    request_id: Name = Field(min_length=1, max_length=128)
    spec: JobSpec

    @classmethod
    def subject_for(cls, account: str) -> str:
        """The sender's subject: the account is the sender's, never a field of the body."""
        return cls.SUBJECT.format(account=account)


class CancelJob(Command):
    TYPE = "gpufleet.job.cancel.v1"
    SUBJECT = subjects.rpc("scheduler", "cancel_job")
    REPLY = JobView
    job_id: str


class MountKind(StrEnum):
    dataset = "dataset"
    input = "input"
    checkpoint = "checkpoint"
    model = "model"
    output = "output"


class Mount(BaseModel):
    """One directory a worker sees (R-JOB-3/4): `target` inside the job, what fills it."""

    model_config = ConfigDict(frozen=True, extra="allow")

    target: Name  # e.g. /opt/ml/input/PASCAL_VOC
    kind: MountKind
    # What fills it (locations.py); None: nothing does (the worker's output, or the directory
    # that holds several datasets or checkpoints).
    source: Source | None = None
    read_only: bool = True
    env: Name | None = None  # the variable that tells the worker where it is

    @field_validator("source", mode="before")
    @classmethod
    def _legacy(cls, value: Any) -> Any:
        """A scheduler before typed locations sent the source as a string."""
        return legacy_source(value) if isinstance(value, str) else value


class SealedSecrets(BaseModel):
    """A worker's secrets (`SecretFields`, as JSON) sealed to its node's key
    (gpufleet_auth.sealing): only that node opens them. `key_id` names the key they were
    sealed to, so a node whose key was replaced since can say so."""

    model_config = ConfigDict(frozen=True)

    key_id: str = Field(max_length=64)
    box: str = Field(max_length=limits.SEALED_SECRETS_CHARS, repr=False)  # base64


class SecretFields(BaseModel):
    """What a worker's `SealedSecrets` hold, opened: StartWorker's secret fields."""

    model_config = ConfigDict(frozen=True)

    env: Annotated[dict[Name, EnvValue], Cap(limits.ENV_VARS, "env_vars", "variables")] = Field(
        default_factory=dict, repr=False
    )
    registry_auth: RegistryAuth | None = Field(default=None, repr=False)
    attached_keys: dict[str, dict[str, str]] = Field(default_factory=dict, repr=False)


class StartWorker(Command):
    """Durable command to one node: run this worker on exactly these GPUs."""

    TYPE = "gpufleet.node.start_worker.v1"
    SUBJECT = subjects.command("node", "start_worker")
    minion_id: Name
    job_id: str
    job_name: Name
    worker: Int
    command: Argv
    # The job's env values: empty from a scheduler that seals them (`sealed_secrets`).
    env: Annotated[dict[Name, EnvValue], Cap(limits.ENV_VARS, "env_vars", "variables")] = Field(
        default_factory=dict, repr=False
    )
    gpu_indices: list[Int]
    gpu_uuids: list[str] = Field(default_factory=list)
    placement_id: str  # unique per placement; a re-placed worker gets a new one
    # the worker's mount plan
    mounts: Annotated[list[Mount], Cap(limits.MOUNTS, "mounts", "mounts")] = Field(
        default_factory=list
    )
    output_archive: Name | None = None  # <job_name>.zip or <job_name>_<worker>.zip
    output: OutputTarget | None = None  # where the archive goes (locations.py), if anywhere
    gpu_fraction: Decimal | None = None  # R-SCHED-4: a share of the (one) GPU
    gpu_memory_limit_mb: Int | None = None  # what the agent enforces for that share
    cpu_count: Int | None = None  # a CPU-only worker's CPUs (R-JOB-2); no GPU then
    disk_size_gb: Int = 10
    # R-JOB-7: the job's customer image (None: the node's base image), and the credential it
    # is pulled with (gpufleet_contracts.images), sealed in the outbox like `env`.
    image: str | None = None
    registry_auth: RegistryAuth | None = Field(default=None, repr=False)
    # R-JOB-7: the job creator's attached keys other than registry keys, {type: {field:
    # value}} (gpufleet_contracts.keys), for this worker alone: sealed in the outbox like
    # `env`, given to the worker as files /run/secrets/<type>/<field>.
    attached_keys: dict[str, dict[str, str]] = Field(default_factory=dict, repr=False)
    # R-JOB-7: without a customer image, the base environment (Python, framework, version)
    # the node runs the job in (None, from an older scheduler: the node's base image); and
    # the packages the node installs, in a networked build step, before the job runs.
    base_environment: BaseEnvironment | None = None
    packages: Packages = Field(default_factory=Packages)
    # Whose job it is (R-TEN-1): its project's owner and its creator, from the job document.
    # The agent runs a job outside a container only when both are the node's owner and its
    # operator opted in (services/node-agent/README.md, "Runtime policy"); None (a command
    # from before these fields) counts as another account's.
    owner: str | None = None
    creator: str | None = None
    # The worker's secrets (`env` values, `registry_auth`, `attached_keys`) sealed to its
    # node's key: the scheduler sends them so and leaves those three fields empty, so the
    # bus, the commands stream and an operator's subscription never see them in clear. The
    # agent opens them in memory (services/node-agent/README.md, "Secrets for the node
    # alone"); the clear fields are read only from a scheduler older than this field.
    sealed_secrets: SealedSecrets | None = Field(default=None, repr=False)
    # An endpoint's worker: how its container serves and what the node's proxy probes
    # (serving.py); None for every other job type.
    serving: Serving | None = None
    # R-RES-3: the port reservation the worker serves on, which its node publishes with mDNS
    reservation: Reservation | None = None

    @model_validator(mode="before")
    @classmethod
    def _legacy_output(cls, data: Any) -> Any:
        """A scheduler before typed locations sent the output target as a string,
        `output_upload` ("aws:s3://b/out")."""
        if isinstance(data, dict) and isinstance(data.get("output_upload"), str):
            data = dict(data)
            upload = data.pop("output_upload")
            if data.get("output") is None:
                data["output"] = legacy_target(upload)
        return data


class StopWorker(Command):
    TYPE = "gpufleet.node.stop_worker.v1"
    SUBJECT = subjects.command("node", "stop_worker")
    minion_id: Name
    job_id: str
    worker: Int
    placement_id: str
    reason: str


# --- events ---------------------------------------------------------------------------


class JobQueued(Event):
    """A job was accepted: its first state, `queued` (no JobStateChanged is sent for it).

    `spec.env` keeps the names only: every value is "<secret>" (gpufleet_contracts.secrets).
    """

    TYPE = "gpufleet.job.queued.v1"
    SUBJECT = subjects.event("job", "queued")
    job_id: str
    owner: str
    creator: str
    spec: JobSpec
    queued_at: datetime
    request_id: str | None = None  # the EnqueueJob this answers, if any


class JobStateChanged(Event):
    """A job's state changed from `previous` (its first state is told by JobQueued)."""

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
    worker: Int
    placement_id: str
    node_id: str
    minion_id: Name
    region: Name
    gpu_model: str
    gpu_indices: list[Int]
    gpu_count: Int
    rate: Money  # credits per GPU-hour, locked
    charge: str  # "usage" (owner's own node, R-BILL-1) or "market" (another account's node)
    payer: str  # the project owner
    node_owner: str
    placed_at: datetime
    creator: str = ""  # the account that submitted the job; != payer for federated jobs
    job_type: JobType = JobType.training
    # Fractional GPUs (R-SCHED-4): gpu_count is 1, `rate` is already the share's rate
    # (rate_per_gpu_hour x gpu_fraction), so billing's rate x gpu_count x time is right.
    gpu_fraction: Decimal | None = None
    rate_per_gpu_hour: Money | None = None
    # A CPU-only worker (R-JOB-2): these CPUs reserved, no GPU (gpu_count 0, gpu_model ""),
    # and `rate` is per CPU-hour, so billing's rate x cpu_count x time is its price.
    cpu_count: Int = 0


class WorkerStarted(Event):
    TYPE = "gpufleet.worker.started.v1"
    SUBJECT = subjects.event("worker", "started") + ".{minion_id}"  # only that node may say it
    job_id: str
    worker: Int
    placement_id: str
    minion_id: Name
    pid: Int | None = None
    started_at: datetime


class WorkerUploading(Event):
    """A worker's command ended and its node is putting its output where the job says
    (R-JOB-8 `uploading`): still running for billing until its WorkerFinished."""

    TYPE = "gpufleet.worker.uploading.v1"
    SUBJECT = subjects.event("worker", "uploading") + ".{minion_id}"  # only that node may say it
    job_id: str
    worker: Int
    placement_id: str
    minion_id: Name
    at: datetime


class StagingState(StrEnum):
    pending = "pending"
    fetching = "fetching"  # or putting, for the output
    waiting = "waiting"  # `local` data: for the user to send it (`gpufleet job connect`)
    done = "done"
    failed = "failed"


class StagingItem(BaseModel):
    """One source being fetched onto the node, or the output being put: `name` is the mount
    target (or the archive's name), `names` what it is fetched from or put to, without
    credentials or query strings."""

    model_config = ConfigDict(frozen=True)
    name: Annotated[str, Field(max_length=200)]
    direction: Literal["download", "upload"] = "download"
    kind: Annotated[str, Field(max_length=40)]
    names: Annotated[str, Field(max_length=500)]
    done: Int = 0
    total: Int | None = None
    rate: Int = 0  # bytes a second, since it began
    state: StagingState = StagingState.pending
    # why a `waiting` item waits when it is not the user (`datastore nas unreachable`)
    reason: Annotated[str | None, Field(max_length=200)] = None


class WorkerStaging(Event):
    """How far a worker's sources are fetched (or its output put), at most once a second
    from its node; the scheduler shows the latest and keeps none in the history."""

    TYPE = "gpufleet.worker.staging.v1"
    SUBJECT = subjects.event("worker", "staging") + ".{minion_id}"  # only that node may say it
    job_id: str
    worker: Int
    placement_id: str
    minion_id: Name
    at: datetime
    items: Annotated[list[StagingItem], Field(max_length=64)] = Field(default_factory=list)


class WorkerFinished(Event):
    """A worker ended: `finished` (exit 0), `failed` (non-zero exit or lost) or `stopped`."""

    TYPE = "gpufleet.worker.finished.v1"
    SUBJECT = subjects.event("worker", "finished") + ".{minion_id}"  # the node, or the scheduler
    job_id: str
    worker: Int
    placement_id: str
    minion_id: Name
    state: WorkerState
    exit_code: Int | None = None
    reason: str | None = None
    started_at: datetime | None = None
    ended_at: datetime
    log_tail: str = ""


def spec_from_mapping(data: dict[str, Any]) -> JobSpec:
    return JobSpec.model_validate(data)


class GetJob(Command):
    TYPE = "gpufleet.job.get.v1"
    SUBJECT = subjects.rpc("scheduler", "get_job")
    REPLY = JobView
    READ = True
    job_id: str


class GetJobLogs(Command):
    """A page of a job's worker logs, from the log stream of each node its workers ran on
    (subjects.node_logs_stream), after the stream sequence `cursor` names for that node
    (`after`: for every node, as a client without `cursor` asks)."""

    TYPE = "gpufleet.job.logs.v1"
    SUBJECT = subjects.rpc("scheduler", "job_logs")
    REPLY = JobLogs
    READ = True
    job_id: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    after: int = Field(default=0, ge=0, strict=True)
    limit: int = Field(default=256, ge=1, le=1000, strict=True)
    cursor: dict[
        Annotated[str, Field(pattern=subjects.ACCOUNT_RE.pattern)],
        Annotated[int, Field(ge=0, strict=True)],
    ] = Field(default_factory=dict, max_length=64)


class ListJobs(Command):
    TYPE = "gpufleet.job.list.v1"
    SUBJECT = subjects.rpc("scheduler", "list_jobs")
    REPLY = JobList
    READ = True
    limit: Int = Field(default=100, ge=1, le=1000)


class ListAllJobs(Command):
    """Operator request: the jobs of every account, newest first; `account` keeps those it
    owns or created, `state` those in that state. Answered with a JobList."""

    TYPE = "gpufleet.job.list_all.v1"
    SUBJECT = subjects.admin("scheduler", "list_all_jobs")
    REPLY = JobList
    READ = True
    limit: Int = Field(default=100, ge=1, le=1000)
    account: str | None = Field(default=None, pattern=subjects.ACCOUNT_RE.pattern)
    state: JobState | None = None


class Demand(BaseModel):
    """One waiting worker that no node can take now."""

    model_config = ConfigDict(frozen=True, extra="allow")

    job_id: str
    worker: Int
    owner: str
    project: Name
    gpu_types: list[str]
    gpu_count: Int
    max_price: Money | None = None
    region: Name | None = None  # pinned region (R-RES-1), if any
    burst_allowed: bool = False  # the project allows bursting to the cloud (R-SCHED-3)
    waiting_since: datetime
    gpu_fraction: Decimal | None = None
    reason: str | None = None  # why no node can take it now
    cpu_count: Int = 0  # a CPU-only worker's CPUs (gpu_types empty, gpu_count 0)


class PendingDemandChanged(Event):
    """The scheduler's unplaceable work changed: what the provisioner may burst for."""

    TYPE = "gpufleet.scheduler.pending_demand_changed.v1"
    SUBJECT = subjects.event("scheduler", "pending_demand_changed")
    demands: list[Demand]
    at: datetime
    # At most MAX_DEMANDS, oldest first, so the event fits a NATS message (1 MB by default);
    # `waiting` counts every waiting worker (a fleet's queue can hold 100,000).
    waiting: Int | None = None

    MAX_DEMANDS: ClassVar[int] = 1000


class JobRejected(Event):
    """An `EnqueueJob` was refused (e.g. a region pin that can never start, R-RES-1)."""

    TYPE = "gpufleet.job.rejected.v1"
    SUBJECT = subjects.event("job", "rejected")
    request_id: str
    account: str
    error: ErrorBody
    at: datetime
