"""The parts of a job specification (PRODUCT.md R-JOB-2..7, R-RES-1..3, R-SCHED-4).

Every model is frozen and refuses unknown fields; every refusal names its field (by its
path), the rule it broke and what would be valid (`ctx["rule"]`, `ctx["valid"]`, which
`errors.field_errors` reads). `JobSpec` in `jobs.py` composes them; cross-field rules that
need the job type are checked there, on the field that breaks them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from enum import StrEnum
from typing import Annotated, Any, ClassVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from . import limits, package_entries
from .errors import rule, ruled
from .fields import Cap, Int, Name, PackageList, PackageName
from .paths import UnsafePath, contained_path

_FROZEN = ConfigDict(frozen=True, extra="forbid")
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def bad(code: str, message: str, rule_id: str, valid: str, **ctx: Any) -> PydanticCustomError:
    """A validation error that carries its rule and what would be valid."""
    return PydanticCustomError(code, message, {**ctx, "rule": rule_id, "valid": valid})


def dir_name(name: str) -> str:
    """R-JOB-3/4: a dataset or checkpoint directory is its name with spaces as underscores."""
    return re.sub(r"\s+", "_", name.strip())


# --- data (R-JOB-3) -------------------------------------------------------------------


class StorageType(StrEnum):
    aws = "aws"
    azure = "azure"
    gcp = "gcp"
    local = "local"
    wasabi = "wasabi"
    web = "web"
    regional_datastore = "regional_datastore"
    platform = "platform"
    git = "git"  # model code only


# The path forms each storage type accepts (R-JOB-3, R-JOB-4).
PATH_FORMS: dict[StorageType, tuple[tuple[str, ...], str]] = {
    StorageType.aws: (("s3://",), "s3://bucket/path"),
    StorageType.azure: (("https://",), "https://account.blob.core.windows.net/..."),
    StorageType.gcp: (("gs://",), "gs://bucket/path"),
    StorageType.local: (("/", "~/", "$"), "/abs/path, ~/path or $VAR/path (never ./)"),
    StorageType.wasabi: (("s3://",), "s3://bucket/path (with an endpoint)"),
    StorageType.web: (
        ("http://", "https://", "ftp://", "ftps://"),
        "http(s):// or ftp(s):// URL",
    ),
    StorageType.regional_datastore: (("/",), "an absolute path inside the datastore"),
    StorageType.git: (
        ("http://", "https://", "ssh://", "git@"),
        "http(s) or ssh git clone URL",
    ),
}
PLATFORM_OUTPUTS = ("model", "dataset", "checkpoint")
WEB_ONLY_INPUT = "web is an input type only"


def _check_location(
    kind: StorageType,
    path: str,
    endpoint: str | None,
    datastore: str | None,
    rule_id: str,
    region: str | None = None,
) -> None:
    if kind is StorageType.platform:
        return  # checked by the direction (output: model | dataset | checkpoint)
    prefixes, valid = PATH_FORMS[kind]
    if not path.startswith(prefixes) or path.startswith("./"):
        raise bad(
            "storage_path",
            "{kind} path must start with {forms}, got {path!r}",
            rule_id,
            valid,
            kind=kind.value,
            forms=" or ".join(prefixes),
            path=path,
        )
    if kind is StorageType.regional_datastore and not datastore:
        raise bad(
            "datastore_required",
            "a regional_datastore location names its datastore",
            "R-RES-2",
            "datastore: <name of a datastore in the region>",
        )
    if kind is StorageType.regional_datastore and not region:
        raise bad(
            "region_required",
            "a regional_datastore location names its region (a datastore is a region's, and "
            "the job runs there)",
            "R-RES-1",
            "region: <one of your regions, where the datastore is>",
        )
    if kind is StorageType.wasabi and not endpoint:
        raise bad(
            "endpoint_required",
            "wasabi needs the endpoint (service URL) of the bucket",
            rule_id,
            "endpoint: https://s3.<region>.wasabisys.com",
        )
    if endpoint and kind is not StorageType.wasabi:
        raise bad(
            "endpoint_only_wasabi",
            "endpoint is for wasabi only, not {kind}",
            rule_id,
            "leave endpoint out",
            kind=kind.value,
        )


def inside_root(path: str) -> str:
    """R-RES-2: nothing may resolve outside the datastore root; the path's canonical form."""
    try:
        return contained_path(path, rooted=True)
    except UnsafePath as exc:
        raise bad(
            "outside_root",
            "path {path!r} could resolve outside the datastore root: {why}",
            "R-RES-2",
            "an absolute path inside the root, without .., NUL, backslashes or encodings of them",
            path=path,
            why=str(exc),
        ) from exc


class _Located(BaseModel):
    """A storage location: type + path (+ endpoint for wasabi, datastore+region for regional)."""

    model_config = _FROZEN

    type: StorageType = Field(json_schema_extra=rule("R-JOB-3"))
    path: str = Field(min_length=1, max_length=1024, json_schema_extra=rule("R-JOB-3"))
    endpoint: str | None = Field(default=None, json_schema_extra=rule("R-JOB-3"))
    datastore: Name | None = Field(
        default=None, max_length=limits.NAME_CHARS, json_schema_extra=rule("R-RES-2")
    )
    region: Name | None = Field(
        default=None, max_length=limits.NAME_CHARS, json_schema_extra=rule("R-RES-1")
    )

    @field_validator("path")
    @classmethod
    def _datastore_path(cls, value: str, info: ValidationInfo) -> str:
        """A datastore path is kept in its canonical (decoded) form, the one checked; one
        without its leading `/` is refused by its type's path form (R-JOB-3)."""
        if info.data.get("type") is StorageType.regional_datastore and value.startswith("/"):
            return inside_root(value)
        return value


@ruled
class InputData(_Located):
    """Inference input, downloaded before the workers start (R-JOB-3)."""

    @model_validator(mode="after")
    def _valid(self) -> InputData:
        if self.type in (StorageType.platform, StorageType.git):
            raise bad(
                "input_type",
                "{kind} is not an input data type",
                "R-JOB-3",
                "aws, azure, gcp, local, wasabi, web, regional_datastore",
                kind=self.type.value,
            )
        _check_location(self.type, self.path, self.endpoint, self.datastore, "R-JOB-3", self.region)
        return self


@ruled
class OutputData(_Located):
    """Where ML_OUTPUT_PATH is uploaded when a worker ends (R-JOB-3)."""

    @model_validator(mode="after")
    def _valid(self) -> OutputData:
        if self.type in (StorageType.web, StorageType.git):
            raise bad(
                "output_type",
                "{kind} is not an output data type",
                "R-JOB-3",
                "aws, azure, gcp, local, wasabi, regional_datastore, platform",
                kind=self.type.value,
            )
        if self.type is StorageType.platform:
            if self.path not in PLATFORM_OUTPUTS:
                raise bad(
                    "platform_output",
                    "platform output must be model, dataset or checkpoint, got {path!r}",
                    "R-JOB-3",
                    ", ".join(PLATFORM_OUTPUTS),
                    path=self.path,
                )
            return self
        _check_location(self.type, self.path, self.endpoint, self.datastore, "R-JOB-3", self.region)
        return self


@ruled
class Dataset(BaseModel):
    """A persistent dataset attached to a notebook or training job (R-JOB-3)."""

    model_config = _FROZEN

    name: Name = Field(
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9 _.\-]*$",
        json_schema_extra=rule("R-JOB-3", **{"x-valid": "1-128 letters, digits, space, _ . -"}),
    )
    public: bool = False


@ruled
class Checkpoint(BaseModel):
    """A checkpoint mounted into every worker (R-JOB-4)."""

    model_config = _FROZEN

    name: Name = Field(
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9 _.\-]*$",
        json_schema_extra=rule("R-JOB-4", **{"x-valid": "1-128 letters, digits, space, _ . -"}),
    )
    public: bool = False


@ruled
class ModelSource(BaseModel):
    """Model code, loaded at /opt/ml/models (R-JOB-4)."""

    model_config = _FROZEN

    source: StorageType = Field(json_schema_extra=rule("R-JOB-4"))
    path: str = Field(min_length=1, max_length=1024, json_schema_extra=rule("R-JOB-4"))
    endpoint: str | None = Field(default=None, json_schema_extra=rule("R-JOB-4"))

    @model_validator(mode="after")
    def _valid(self) -> ModelSource:
        if self.source is StorageType.regional_datastore:
            raise bad(
                "model_source",
                "model code cannot come from a regional datastore",
                "R-JOB-4",
                "aws, azure, gcp, git, local, wasabi, web, platform",
            )
        if self.source is not StorageType.platform:
            _check_location(self.source, self.path, self.endpoint, None, "R-JOB-4")
        return self


# --- endpoints (R-JOB-6) --------------------------------------------------------------


class Framework(StrEnum):
    deep_learning = "deep_learning"
    pytorch = "pytorch"
    tensorflow = "tensorflow"
    mxnet = "mxnet"


# What a base environment may name. Every gpufleet node builds Python 3.11 (Debian bookworm's)
# with deep_learning, pytorch or tensorflow; the other versions, and mxnet, run only where a
# node's operator maps an image (environments.py): admission refuses a triple no node of the
# fleet offers, naming the field (services/scheduler/README.md, "Base environments").
PYTHON_VERSIONS = ("3.8", "3.9", "3.10", "3.11", "3.12")
THIRD_PARTY_KEYS = (
    "aws",
    "azure",
    "gcp",
    "wasabi",
    "docker",
    "ngc",
    "huggingface",
    "wandb",
    "kaggle",
    "git",
    "ssh",
)
# What a customer image must provide for these job types (R-JOB-7).
IMAGE_NEEDS = {
    "notebook": ("jupyterlab",),
    "endpoint": ("fastapi", "pydantic", "uvicorn[standard]", "python-multipart"),
}


def _entry_check(kind: str) -> Callable[[str], str]:
    """The check of an entry of `packages.<kind>` (package_entries.py): refused naming the
    entry and why."""

    def check(entry: str) -> str:
        problem = package_entries.PROBLEMS[kind](entry)
        if problem is not None:
            raise bad(
                "package",
                "{p}: {problem}",
                "R-JOB-7",
                package_entries.VALID[kind],
                p=entry,
                problem=problem,
            )
        return entry

    return check


_ENTRIES = Cap(limits.PACKAGES, "packages", "entries")
AptList = Annotated[list[Annotated[PackageName, AfterValidator(_entry_check("apt"))]], _ENTRIES]
CondaList = Annotated[list[Annotated[PackageName, AfterValidator(_entry_check("conda"))]], _ENTRIES]
RequirementsLines = Annotated[
    list[Annotated[PackageName, AfterValidator(_entry_check("requirements"))]], _ENTRIES
]
PipList = Annotated[list[Annotated[PackageName, AfterValidator(_entry_check("pip"))]], _ENTRIES]


@ruled
class Packages(BaseModel):
    """Installed in the order apt, conda, requirements.txt, pip (R-JOB-7).

    `requirements` holds the lines of a requirements.txt, installed with `pip install -r`
    between conda and pip. Every entry is data, a name with a version spec in its kind's
    grammar (package_entries.py): never a URL, a local path or an installer option.
    """

    model_config = _FROZEN

    apt: AptList = Field(default_factory=list, json_schema_extra=rule("R-JOB-7"))
    conda: CondaList = Field(default_factory=list, json_schema_extra=rule("R-JOB-7"))
    requirements: RequirementsLines = Field(default_factory=list, json_schema_extra=rule("R-JOB-7"))
    pip: PipList = Field(default_factory=list, json_schema_extra=rule("R-JOB-7"))

    def empty(self) -> bool:
        return not (self.apt or self.conda or self.requirements or self.pip)

    INSTALL_ORDER: ClassVar[tuple[str, ...]] = ("apt", "conda", "requirements.txt", "pip")


@ruled
class BaseEnvironment(BaseModel):
    """The base environment a job without its own image runs in (R-JOB-7), as StartWorker
    carries it to the node, which builds (or maps) one image per triple."""

    model_config = _FROZEN

    python_version: str = Field(json_schema_extra=rule("R-JOB-7"))
    framework: Framework = Field(json_schema_extra=rule("R-JOB-7"))
    framework_version: Name | None = Field(
        default=None, max_length=64, json_schema_extra=rule("R-JOB-7")
    )


@ruled
class Environment(BaseModel):
    model_config = _FROZEN

    python_version: str = Field(
        default="3.11",
        json_schema_extra=rule("R-JOB-7", **{"x-valid": ", ".join(PYTHON_VERSIONS)}),
    )
    framework: Framework = Field(default=Framework.deep_learning, json_schema_extra=rule("R-JOB-7"))
    framework_version: Name | None = Field(
        default=None, max_length=64, json_schema_extra=rule("R-JOB-7")
    )
    image: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9][a-z0-9._\-/:@]*$",
        max_length=256,
        json_schema_extra=rule("R-JOB-7", **{"x-valid": "registry/name:tag"}),
    )
    image_size_gb: Int | None = Field(
        default=None, ge=0, json_schema_extra=rule("R-JOB-7", **{"x-valid": "<= disk_size_gb"})
    )
    image_packages: PackageList = Field(default_factory=list, json_schema_extra=rule("R-JOB-7"))
    packages: Packages = Field(default_factory=Packages, json_schema_extra=rule("R-JOB-7"))
    keys: list[str] = Field(
        default_factory=list,
        json_schema_extra=rule("R-JOB-7", **{"x-valid": ", ".join(THIRD_PARTY_KEYS)}),
    )

    @field_validator("python_version")
    @classmethod
    def _python(cls, v: str) -> str:
        if v not in PYTHON_VERSIONS:
            raise bad(
                "python_version",
                "no base environment for Python {v}",
                "R-JOB-7",
                ", ".join(PYTHON_VERSIONS),
                v=v,
            )
        return v

    @field_validator("keys")
    @classmethod
    def _keys(cls, v: list[str]) -> list[str]:
        unknown = [k for k in v if k not in THIRD_PARTY_KEYS]
        if unknown:
            raise bad(
                "third_party_key",
                "unknown third-party key type(s): {unknown}",
                "R-JOB-7",
                ", ".join(THIRD_PARTY_KEYS),
                unknown=", ".join(unknown),
            )
        return list(dict.fromkeys(v))

    def base(self) -> BaseEnvironment | None:
        """The base environment, or None when a customer image replaces it."""
        if self.image is not None:
            return None
        return BaseEnvironment(
            python_version=self.python_version,
            framework=self.framework,
            framework_version=self.framework_version,
        )

    @model_validator(mode="after")
    def _image(self) -> Environment:
        if self.image is None and (self.image_size_gb is not None or self.image_packages):
            raise bad(
                "image_fields",
                "image_size_gb and image_packages describe a customer image; set image",
                "R-JOB-7",
                "image: registry/name:tag",
            )
        if self.image is not None and self.framework_version is not None:
            raise bad(
                "image_or_base",
                "a customer image replaces the base environment; drop framework_version",
                "R-JOB-7",
                "either image or python_version/framework/framework_version",
            )
        return self


def _dups(items: Any) -> list[str]:
    seen: set[str] = set()
    dup: list[str] = []
    for item in items:
        if item in seen and item not in dup:
            dup.append(item)
        seen.add(item)
    return dup
