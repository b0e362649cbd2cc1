"""Where a worker's data comes from and where its output goes, as types (R-JOB-3, R-JOB-4,
R-RES-2): what the scheduler's mount plan sends in StartWorker and the node's staging reads.

A job spec names a location by its storage type and a path whose form the type fixes
(jobspec.py: `InputData`, `OutputData`, `ModelSource`, `Dataset`, `Checkpoint`). On its way to
a node that becomes one of the models below, told apart by `kind`, so that a node picks what
fetches or uploads it by its type and never parses a string:

| kind | model | the spec's type |
|---|---|---|
| `git` | `GitSource` | `git` (model code) |
| `s3` | `S3Source` | `aws`; `wasabi` (with its endpoint) |
| `gcs` | `GcsSource` | `gcp` |
| `azure` | `AzureSource` | `azure` |
| `web` | `WebSource` | `web` (input only) |
| `local` | `LocalSource` | `local` |
| `datastore` | `DatastoreRef` | `regional_datastore`, or any location that names a datastore |
| `platform` | `PlatformRef` | datasets, checkpoints, `platform` model code and outputs |

`Source` is any of them; `OutputTarget` those an output may go to (not git, not the web).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from . import limits
from .fields import Name
from .jobspec import (
    PATH_FORMS,
    Checkpoint,
    Dataset,
    InputData,
    ModelSource,
    OutputData,
    StorageType,
)

_FROZEN = ConfigDict(frozen=True, extra="forbid")
Url = Annotated[str, Field(min_length=1, max_length=1024)]


def _form(kind: StorageType, value: str) -> str:
    """`value` in the form its storage type fixes (jobspec.PATH_FORMS), or refused."""
    prefixes, valid = PATH_FORMS[kind]
    if not value.startswith(prefixes):
        raise ValueError(f"{kind.value} location must be {valid}, got {value[:80]!r}")
    return value


class GitSource(BaseModel):
    """A git repository, cloned (model code, R-JOB-4)."""

    model_config = _FROZEN
    kind: Literal["git"] = "git"
    url: Url  # http(s) or ssh clone URL

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return _form(StorageType.git, value)


class S3Source(BaseModel):
    """An S3 object or prefix: AWS, or another S3 service at `endpoint` (wasabi)."""

    model_config = _FROZEN
    kind: Literal["s3"] = "s3"
    url: Url  # s3://bucket/path
    endpoint: str | None = None  # None: AWS

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return _form(StorageType.aws, value)


class GcsSource(BaseModel):
    """A Google Cloud Storage object or prefix."""

    model_config = _FROZEN
    kind: Literal["gcs"] = "gcs"
    url: Url  # gs://bucket/path

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return _form(StorageType.gcp, value)


class AzureSource(BaseModel):
    """An Azure blob or prefix."""

    model_config = _FROZEN
    kind: Literal["azure"] = "azure"
    url: Url  # https://<account>.blob.core.windows.net/...

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return _form(StorageType.azure, value)


class WebSource(BaseModel):
    """A file on the web (input only)."""

    model_config = _FROZEN
    kind: Literal["web"] = "web"
    url: Url  # http(s):// or ftp(s)://

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        return _form(StorageType.web, value)


class LocalSource(BaseModel):
    """A path on the user's own machine: `/abs`, `~/rel` or `$VAR/rel` (never `./`), expanded
    there by `gpufleet job connect`, which sends it (or receives the output) through the
    platform's store (localdata.py); never a path on the node."""

    model_config = _FROZEN
    kind: Literal["local"] = "local"
    path: Url

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        if value.startswith("./"):
            raise ValueError("a local location is never relative (./)")
        return _form(StorageType.local, value)


class DatastoreRef(BaseModel):
    """A path in one of the region's NFS/SMB datastores (R-RES-2), relative to its root: a
    `regional_datastore` location's, which the spec checked stays inside the root, or the
    path of a location of another type that names a datastore, as the spec gave it."""

    model_config = _FROZEN
    kind: Literal["datastore"] = "datastore"
    datastore: Name = Field(min_length=1, max_length=limits.NAME_CHARS)
    path: Url
    region: Name | None = Field(default=None, max_length=limits.NAME_CHARS)


class PlatformAsset(StrEnum):
    dataset = "dataset"
    checkpoint = "checkpoint"
    model = "model"


class PlatformRef(BaseModel):
    """One of gpufleet's own datasets, checkpoints or models. As an output target, `name` is
    None: the job's output becomes an asset of that kind (R-JOB-3)."""

    model_config = _FROZEN
    kind: Literal["platform"] = "platform"
    asset: PlatformAsset
    name: str | None = Field(default=None, min_length=1, max_length=1024)
    public: bool = False


Source = Annotated[
    GitSource
    | S3Source
    | GcsSource
    | AzureSource
    | WebSource
    | LocalSource
    | DatastoreRef
    | PlatformRef,
    Field(discriminator="kind"),
]
OutputTarget = Annotated[
    S3Source | GcsSource | AzureSource | LocalSource | DatastoreRef | PlatformRef,
    Field(discriminator="kind"),
]


# --- from a job spec (the scheduler's mount plan) --------------------------------------


def located(
    kind: StorageType,
    path: str,
    *,
    endpoint: str | None = None,
    datastore: str | None = None,
    region: str | None = None,
) -> Source:
    """The location a spec names by storage type and path (not `platform`). One that names
    a datastore is in that datastore, whatever its type says (as tenancy.py counts it)."""
    if datastore:
        return DatastoreRef(datastore=datastore, path=path, region=region)
    match kind:
        case StorageType.aws | StorageType.wasabi:
            return S3Source(url=path, endpoint=endpoint)
        case StorageType.gcp:
            return GcsSource(url=path)
        case StorageType.azure:
            return AzureSource(url=path)
        case StorageType.web:
            return WebSource(url=path)
        case StorageType.local:
            return LocalSource(path=path)
        case StorageType.git:
            return GitSource(url=path)
        case StorageType.regional_datastore:
            raise ValueError("a regional_datastore location names its datastore (R-RES-2)")
        case StorageType.platform:
            raise ValueError("a platform location is a PlatformRef")


def input_source(data: InputData) -> Source:
    return located(
        data.type, data.path, endpoint=data.endpoint, datastore=data.datastore, region=data.region
    )


def output_target(data: OutputData) -> OutputTarget:
    if data.type is StorageType.platform:
        return PlatformRef(asset=PlatformAsset(data.path))
    target = located(
        data.type, data.path, endpoint=data.endpoint, datastore=data.datastore, region=data.region
    )
    if isinstance(target, (GitSource, WebSource)):  # refused by OutputData already
        raise ValueError(f"{data.type.value} is not an output data type")
    return target


def model_source(model: ModelSource) -> Source:
    if model.source is StorageType.platform:
        return PlatformRef(asset=PlatformAsset.model, name=model.path)
    return located(model.source, model.path, endpoint=model.endpoint)


def dataset_source(dataset: Dataset) -> PlatformRef:
    return PlatformRef(asset=PlatformAsset.dataset, name=dataset.name, public=dataset.public)


def checkpoint_source(checkpoint: Checkpoint) -> PlatformRef:
    return PlatformRef(
        asset=PlatformAsset.checkpoint, name=checkpoint.name, public=checkpoint.public
    )


# --- as a scheduler before these types wrote them ----------------------------------------

# What filled a mount that nothing fills: the worker's own output, and the directory that
# holds several datasets or checkpoints.
_NOTHING = frozenset({"worker", "datasets", "checkpoints"})


def legacy_source(text: str) -> Source | None:
    """A mount's source as a scheduler before these types rendered it (`"dataset:coco"`,
    `"aws:s3://b/k"`, `"regional_datastore:nfs1:/data"`, `"worker"`): typed, or None for a
    mount nothing fills. A wasabi endpoint was never in the string: such a source reads as
    AWS's. Refused (ValueError) when it is none of those forms."""
    if text in _NOTHING:
        return None
    origin, sep, rest = text.partition(":")
    if not sep:
        raise ValueError(f"not a mount source: {text[:80]!r}")
    public = origin.startswith("public ")
    asset = origin.removeprefix("public ")
    if asset in (PlatformAsset.dataset, PlatformAsset.checkpoint):
        return PlatformRef(asset=PlatformAsset(asset), name=rest, public=public)
    try:
        kind = StorageType(origin)
    except ValueError:
        raise ValueError(f"not a mount source: {text[:80]!r}") from None
    if kind is StorageType.regional_datastore:
        datastore, sep, path = rest.partition(":")
        if not sep:
            raise ValueError(f"a datastore source names its datastore: {text[:80]!r}")
        return DatastoreRef(datastore=datastore, path=path)
    if kind is StorageType.platform:
        return PlatformRef(asset=PlatformAsset.model, name=rest)
    return located(kind, rest)


def legacy_target(text: str) -> OutputTarget | None:
    """An output target as a scheduler before these types rendered it (`"aws:s3://b/out"`,
    `"platform:model"`): typed, or None for one the string cannot say (a regional datastore
    lost its name in it)."""
    origin, sep, rest = text.partition(":")
    try:
        kind = StorageType(origin) if sep else None
    except ValueError:
        kind = None
    if kind is None:
        raise ValueError(f"not an output target: {text[:80]!r}")
    if kind is StorageType.platform:
        return PlatformRef(asset=PlatformAsset(rest))
    if kind is StorageType.regional_datastore:
        return None
    target = located(kind, rest)
    if isinstance(target, (GitSource, WebSource)):
        raise ValueError(f"not an output target: {text[:80]!r}")
    return target
