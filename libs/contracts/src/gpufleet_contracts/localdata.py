"""`local` data (R-JOB-3, R-JOB-4): a job's input, model code or checkpoint on the user's own
machine, and its output sent back there, relayed through the platform's object store.

The user's machine and the node never connect to each other. `gpufleet job connect <id>`
asks the scheduler (rpc.scheduler.connect_job.<account>: the job's own account only; any
other's job is "not found") for a presigned PUT URL per `local` mount, puts the files there
and says so (`local_data_sent`); the node's fetcher for `local` asks the scheduler
(nrpc.scheduler.stage_local_data.<minion_id>: a placement it holds only) and is answered
"waiting" until then, and a presigned GET URL after. A `local` output goes the other way:
the node puts it in the relay when the worker ends, and `job connect` downloads it. The
scheduler has the datastore grant the URLs (svc.datastore.<verb>: the scheduler's only), for
keys under `local/<job_id>/` in the platform bucket, kept RELAY_DAYS after they are sent.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from . import subjects
from .base import Command
from .fields import Int

RELAY_DAYS = 7  # what was sent through the relay is kept this long, then removed
OUTPUT = "output"  # the mount an output is relayed under
FILE_NAME_CHARS = 200
MountName = Annotated[str, Field(min_length=1, max_length=200)]  # a mount's target, or OUTPUT
FileName = Annotated[str, Field(min_length=1, max_length=FILE_NAME_CHARS)]
RelayState = Literal["waiting", "uploading", "ready"]


class LocalFile(BaseModel):
    """What the user is about to send for one `local` mount: `name` is the file's own name,
    or `<dir>.tar` for a directory (unpacked into the mount on the node)."""

    mount: MountName
    name: FileName


# --- the user's requests (rpc.scheduler.<verb>.<account>) ------------------------------------


class LocalConnection(BaseModel):
    """A job's `local` data as `job connect` reads it: `outputs_expected` of its workers'
    outputs come down (0: it has no `local` output), `downloads` those sent so far."""

    job_id: str
    job_name: str
    state: str
    mounts: list[LocalMountView]
    uploads: list[RelayGrant] = Field(default_factory=list)
    downloads: list[RelayGrant] = Field(default_factory=list)
    outputs_expected: int = 0


class ConnectJob(Command):
    """Connect to one of your jobs: its `local` mounts and where they stand, a PUT URL for each
    file named in `sending`, and a GET URL for each of its `local` outputs already sent."""

    TYPE = "gpufleet.scheduler.connect_job.v1"
    SUBJECT = subjects.rpc("scheduler", "connect_job")
    REPLY = LocalConnection
    READ = True
    job_id: str = Field(min_length=1, max_length=64)
    sending: Annotated[list[LocalFile], Field(max_length=16)] = Field(default_factory=list)


class LocalMountView(BaseModel):
    """One `local` mount of a job: where it is on the user's machine (`path`, as the spec
    wrote it: expanded there), whether it goes up (`input`) or comes down (`output`)."""

    mount: MountName
    path: str
    direction: Literal["input", "output"]
    state: RelayState = "waiting"
    size: int | None = None


class LocalDataSent(Command):
    """You put the file of one of your job's `local` mounts: the datastore reads its size and
    checksum from the store, and the job's workers get it."""

    TYPE = "gpufleet.scheduler.local_data_sent.v1"
    SUBJECT = subjects.rpc("scheduler", "local_data_sent")
    REPLY = LocalMountView
    job_id: str = Field(min_length=1, max_length=64)
    mount: MountName


class RelayGrant(BaseModel):
    """Where to PUT or GET one relayed file until `expires_at`; its size and SHA-256 once
    it is in the store. The URL is a credential: only its requester sees it."""

    mount: MountName
    name: FileName
    method: Literal["GET", "PUT"]
    url: str
    expires_at: datetime
    size: int | None = None
    sha256: str | None = None


# --- a node's requests (nrpc.scheduler.<verb>.<minion_id>) ------------------------------------


class LocalStage(BaseModel):
    """A node's answer: `waiting` (no grant: ask again), or a grant to read or write."""

    state: RelayState
    grant: RelayGrant | None = None


class StageLocalData(Command):
    """A node asks for a `local` mount of a placement it holds: `read` its input (answered
    `waiting` until the user sent it), or `write` its output (`mount` OUTPUT)."""

    TYPE = "gpufleet.scheduler.stage_local_data.v1"
    SUBJECT = subjects.node_request("scheduler", "stage_local_data")
    REPLY = LocalStage
    job_id: str
    placement_id: str
    worker: Int
    mount: MountName
    mode: Literal["read", "write"]


class RelayedView(BaseModel):
    """One relayed file as the datastore keeps it (never its key)."""

    account: str
    job_id: str
    mount: MountName
    name: FileName
    worker: Int = 0
    state: Literal["uploading", "ready"]
    size: int | None = None
    sha256: str | None = None
    created_at: datetime
    expires_at: datetime


class CompleteLocalUpload(Command):
    """A node put its placement's `local` output: the datastore reads its size and checksum."""

    TYPE = "gpufleet.scheduler.complete_local_upload.v1"
    SUBJECT = subjects.node_request("scheduler", "complete_local_upload")
    REPLY = RelayedView
    job_id: str
    placement_id: str
    worker: Int


# --- between the services (svc.datastore.<verb>: the scheduler's only) -----------------------


class RelayedList(BaseModel):
    relayed: list[RelayedView]


class GrantRelay(Command):
    """A presigned URL of `account`'s job's relayed file: `write` (a new upload of `name`,
    over any earlier one of the same mount and worker), or `read` (only a ready one: else
    a LocalStage `waiting` without a grant)."""

    TYPE = "gpufleet.datastore.grant_relay.v1"
    SUBJECT = subjects.service_call("datastore", "grant_relay")
    REPLY = LocalStage
    account: str
    job_id: str
    mount: MountName
    worker: Int = 0
    name: FileName | None = None  # write: the file's name
    mode: Literal["read", "write"]


class CompleteRelay(Command):
    """The upload of `account`'s job's relayed file is done: the datastore reads its size and
    checksum from the store and marks it ready (or refuses: nothing was put)."""

    TYPE = "gpufleet.datastore.complete_relay.v1"
    SUBJECT = subjects.service_call("datastore", "complete_relay")
    REPLY = RelayedView
    account: str
    job_id: str
    mount: MountName
    worker: Int = 0


class ListRelayed(Command):
    """The relayed files of `account`'s job."""

    TYPE = "gpufleet.datastore.list_relayed.v1"
    SUBJECT = subjects.service_call("datastore", "list_relayed")
    REPLY = RelayedList
    READ = True
    account: str
    job_id: str
