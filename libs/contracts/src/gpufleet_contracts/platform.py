"""Platform objects (R-JOB-3, R-JOB-4): an account's datasets, models and checkpoints in the
object store the operator configured on the datastore service.

An account reads and removes its own (rpc.datastore.<verb>.<account>); another account's is
"not found", but a public one may be read (listed with `public`, shown or staged as
`<owner>/<name>`), never removed. A node never holds the store's credentials: it asks the
scheduler (nrpc.scheduler.<verb>.<minion_id>) for its placement's object, and the scheduler,
having checked the placement is that node's, asks the datastore for a presigned URL for the
job's owner (svc.datastore.<verb>: only the scheduler may publish it).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field, model_validator

from . import subjects
from .base import Command
from .fields import Int
from .locations import PlatformAsset

OBJECT_NAME_CHARS = 200
ObjectName = str  # `<name>`, or `<owner>/<name>` for another account's public object


class PlatformObjectList(BaseModel):
    objects: list[PlatformObjectView]


class ListPlatformObjects(Command):
    """The acting account's objects of one asset kind (or, `public`, every account's public
    ones), newest first."""

    TYPE = "gpufleet.datastore.list_platform_objects.v1"
    SUBJECT = subjects.rpc("datastore", "list_platform_objects")
    REPLY = PlatformObjectList
    READ = True
    asset: PlatformAsset
    public: bool = False
    limit: Int = Field(default=100, ge=1, le=1000)


class PlatformObjectView(BaseModel):
    """An object as its owner (or, public, anyone) reads it; never its key in the store."""

    account: str
    asset: PlatformAsset
    name: str
    state: Literal["uploading", "ready"]
    size: int | None = None
    sha256: str | None = None
    public: bool = False
    job_id: str | None = None
    created_at: datetime
    ready_at: datetime | None = None


class GetPlatformObject(Command):
    """One object: the acting account's `name`, or another account's public `<owner>/<name>`."""

    TYPE = "gpufleet.datastore.get_platform_object.v1"
    SUBJECT = subjects.rpc("datastore", "get_platform_object")
    REPLY = PlatformObjectView
    READ = True
    asset: PlatformAsset
    name: str = Field(min_length=1, max_length=OBJECT_NAME_CHARS * 2)


class RemovePlatformObject(Command):
    """Remove one of the acting account's objects, and its bytes from the store."""

    TYPE = "gpufleet.datastore.remove_platform_object.v1"
    SUBJECT = subjects.rpc("datastore", "remove_platform_object")
    REPLY = PlatformObjectView
    asset: PlatformAsset
    name: str = Field(min_length=1, max_length=OBJECT_NAME_CHARS)


# --- between the services (svc.datastore.<verb>: the scheduler's only) -----------------------


class PlatformGrant(BaseModel):
    """Where to GET or PUT the object's bytes, until `expires_at`."""

    account: str
    asset: PlatformAsset
    name: str
    method: Literal["GET", "PUT"]
    url: str
    expires_at: datetime


class GrantPlatformObject(Command):
    """A presigned URL of `account`'s object: `read` a ready object it owns (or a public
    `<owner>/<name>`), `write` a new one named after the job (`name`: the job's name; taken:
    `<name>-<n>`), which stays `uploading` until CompletePlatformObject. For a job's worker
    (`job_id`), or a device's configuration (`device`: its minion id; `read` only)."""

    TYPE = "gpufleet.datastore.grant_platform_object.v1"
    SUBJECT = subjects.service_call("datastore", "grant_platform_object")
    REPLY = PlatformGrant
    account: str
    asset: PlatformAsset
    name: str = Field(min_length=1, max_length=OBJECT_NAME_CHARS * 2)
    mode: Literal["read", "write"]
    job_id: str | None = None
    device: str | None = None
    worker: Int = 0
    public: bool = False  # write: the new object is readable by every account

    @model_validator(mode="after")
    def _for_one(self) -> GrantPlatformObject:
        if (self.job_id is None) == (self.device is None):
            raise ValueError("a grant is for a job or for a device, one of them")
        if self.device is not None and self.mode != "read":
            raise ValueError("a device is granted reads only")
        return self


class CompletePlatformObject(Command):
    """The job's upload of `account`'s object `name` is done: the datastore reads its size and
    checksum from the store and marks it ready (or refuses: nothing was put)."""

    TYPE = "gpufleet.datastore.complete_platform_object.v1"
    SUBJECT = subjects.service_call("datastore", "complete_platform_object")
    REPLY = PlatformObjectView
    account: str
    asset: PlatformAsset
    name: str = Field(min_length=1, max_length=OBJECT_NAME_CHARS)
    job_id: str


# --- a node's requests to the scheduler (nrpc.scheduler.<verb>.<minion_id>) ------------------


class StagePlatformObject(Command):
    """A node asks for the object one of its placements reads (`read`, `name` set) or writes
    (`write`, its output: `name` None); answered with a PlatformGrant for the job's owner."""

    TYPE = "gpufleet.scheduler.stage_platform_object.v1"
    SUBJECT = subjects.node_request("scheduler", "stage_platform_object")
    REPLY = PlatformGrant
    job_id: str
    placement_id: str
    worker: Int
    asset: PlatformAsset
    name: str | None = Field(default=None, min_length=1, max_length=OBJECT_NAME_CHARS * 2)
    mode: Literal["read", "write"]


class CompletePlatformUpload(Command):
    """A node put its placement's output object (`name`, from its write grant)."""

    TYPE = "gpufleet.scheduler.complete_platform_upload.v1"
    SUBJECT = subjects.node_request("scheduler", "complete_platform_upload")
    REPLY = PlatformObjectView
    job_id: str
    placement_id: str
    worker: Int
    asset: PlatformAsset
    name: str = Field(min_length=1, max_length=OBJECT_NAME_CHARS)
