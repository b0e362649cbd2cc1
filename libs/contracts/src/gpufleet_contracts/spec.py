"""A job as a user asks for it (PRODUCT.md section 6): JobSpec, its type and states."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from . import limits
from .catalog import catalog
from .endpoints import EndpointSpec, Reservation
from .errors import rule, ruled
from .fields import Argv, Cap, EnvValue, Int, Name
from .jobspec import (
    IMAGE_NEEDS,
    Checkpoint,
    Dataset,
    Environment,
    InputData,
    ModelSource,
    OutputData,
    StorageType,
    _dups,
    bad,
    dir_name,
)
from .projects import PROJECT_REF_VALID, ProjectRefStr
from .secrets import REDACTED, redact_env
from .serving import NOTEBOOK_COMMAND
from .states import JobState as JobState
from .states import JobType as JobType
from .states import Money as Money
from .states import WorkerState as WorkerState

# `gpu_types` entries that mean "no GPU" (PRODUCT.md section 9: "None (CPU only)").
CPU_ONLY_TYPES = frozenset({"None", "None (CPU only)"})
MAX_PINNED = "one region: every regional resource of a job must be in the same region"


def _info_type(info: ValidationInfo) -> JobType | None:
    t = info.data.get("type")
    return t if isinstance(t, JobType) else None


def _only_for(
    value: object, info: ValidationInfo, field: str, rule_id: str, *types: JobType
) -> None:
    t = _info_type(info)
    if value and t is not None and t not in types:
        raise bad(
            "not_for_type",
            "{field} is not available for {type} jobs",
            rule_id,
            "only for " + " and ".join(x.value for x in types) + " jobs",
            field=field,
            type=t.value,
        )


def env_names(value: dict[str, str], rule_id: str) -> dict[str, str]:
    """Environment variable names a process can be given (a job's, R-JOB-7; a device
    configuration's, R-DEV-2), or the error naming the bad ones under `rule_id`."""
    bad_names = [
        k
        for k in value
        if len(k) > limits.ENV_NAME_CHARS or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)
    ]
    if bad_names:
        raise PydanticCustomError(
            "env_name",
            "invalid environment variable name(s): {bad}",
            {
                "bad": ", ".join(repr(k[:32]) for k in bad_names),
                "rule": rule_id,
                "valid": f"[A-Za-z_][A-Za-z0-9_]*, at most {limits.ENV_NAME_CHARS} characters",
            },
        )
    return value


@ruled
class JobSpec(BaseModel):
    """What a user asks for. Every path into gpufleet (CLI flags, file, event) validates this.

    Fields are declared so that the ones a rule depends on (type, workers, gpu counts,
    disk size) come first: cross-field rules are checked on the field that breaks them.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: Name = Field(
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9 _.\-]*$",
        json_schema_extra=rule("R-JOB-2", **{"x-valid": "1-128 letters, digits, space, _ . -"}),
    )
    type: JobType = Field(default=JobType.training, json_schema_extra=rule("R-JOB-1"))
    project: ProjectRefStr = Field(
        default="default",
        json_schema_extra=rule("R-TEN-1", **{"x-valid": PROJECT_REF_VALID}),
    )
    gpu_count: Int = Field(
        default=1,
        ge=0,
        le=16,
        json_schema_extra=rule("R-JOB-2", **{"x-valid": "0..16 GPUs per worker, or 0.25, 0.5 ..."}),
    )
    gpu_fraction: Decimal | None = Field(
        default=None,
        gt=0,
        lt=1,
        max_digits=3,
        decimal_places=2,
        json_schema_extra=rule(
            "R-SCHED-4", **{"x-valid": "a share of one GPU: 0 < f < 1, e.g. 0.25 or 0.5"}
        ),
    )
    cpu_count: Int | None = Field(
        default=None,
        ge=4,
        le=256,
        json_schema_extra=rule(
            "R-JOB-2", **{"x-valid": "4..256, a multiple of 4, for a CPU-only job (gpu_count 0)"}
        ),
    )
    # After the counts: a GPU job names one or more types, a CPU-only job none (R-JOB-2).
    gpu_types: Annotated[list[str], Cap(limits.GPU_TYPES, "gpu_types", "GPU types")] = Field(
        default_factory=list, validate_default=True, json_schema_extra=rule("R-JOB-2")
    )
    max_price: Money | None = Field(
        default=None,
        ge=0,
        json_schema_extra=rule(
            "R-JOB-2",
            **{"x-valid": "credits per GPU-hour (per CPU-hour for a CPU-only job), >= 0"},
        ),
    )
    disk_size_gb: Int = Field(
        default=10,
        ge=10,
        le=1000,
        json_schema_extra=rule("R-JOB-2", **{"x-valid": "10..1000 GB per worker"}),
    )
    workers: Int = Field(
        default=1,
        ge=1,
        le=limits.WORKERS,
        json_schema_extra=rule("R-JOB-5", **{"x-valid": "1..64 (several for training only)"}),
    )
    region: Name | None = Field(
        default=None,
        min_length=1,
        max_length=limits.NAME_CHARS,
        json_schema_extra=rule("R-RES-1", **{"x-valid": "a region with one of the GPU types"}),
    )
    # --- data (R-JOB-3), model and checkpoints (R-JOB-4) ---
    datasets: Annotated[list[Dataset], Cap(limits.DATASETS, "datasets", "datasets")] = Field(
        default_factory=list, json_schema_extra=rule("R-JOB-3")
    )
    input_data: InputData | None = Field(default=None, json_schema_extra=rule("R-JOB-3"))
    output_data: OutputData | None = Field(default=None, json_schema_extra=rule("R-JOB-3"))
    model: ModelSource | None = Field(default=None, json_schema_extra=rule("R-JOB-4"))
    checkpoints: Annotated[
        list[Checkpoint], Cap(limits.CHECKPOINTS, "checkpoints", "checkpoints")
    ] = Field(default_factory=list, json_schema_extra=rule("R-JOB-4"))
    # --- endpoints (R-JOB-6) and reservations (R-RES-3) ---
    endpoint: EndpointSpec | None = Field(
        default=None, validate_default=True, json_schema_extra=rule("R-JOB-6")
    )
    reservation: Reservation | None = Field(default=None, json_schema_extra=rule("R-RES-3"))
    # --- environment (R-JOB-7) ---
    environment: Environment = Field(default_factory=Environment, json_schema_extra=rule("R-JOB-7"))
    # Secret values (R-JOB-7: env is where users put tokens): stored encrypted by the
    # scheduler and, in every event or reply but the worker's own StartWorker, REDACTED.
    env: Annotated[dict[str, EnvValue], Cap(limits.ENV_VARS, "env_vars", "variables")] = Field(
        default_factory=dict, json_schema_extra=rule("R-JOB-7"), repr=False
    )
    allow_burst: bool = Field(default=False, json_schema_extra=rule("R-SCHED-3"))
    # --- what runs (R-JOB-5): one command for all workers, or one per worker ---
    worker_commands: Annotated[list[Argv], Cap(limits.WORKERS, "worker_commands", "commands")] = (
        Field(
            default_factory=list,
            json_schema_extra=rule("R-JOB-5", **{"x-valid": "one command per worker"}),
        )
    )
    command: Argv = Field(
        default_factory=list,
        validate_default=True,
        json_schema_extra=rule("R-JOB-5", **{"x-valid": "a command (after --)"}),
    )

    @model_validator(mode="before")
    @classmethod
    def _fractional_count(cls, data: Any) -> Any:
        """`gpu_count: 0.5` means one GPU's half (R-SCHED-4): stored as gpu_fraction."""
        if isinstance(data, dict) and "gpu_count" in data and "gpu_fraction" not in data:
            try:
                n = Decimal(str(data["gpu_count"]).strip())
            except (ArithmeticError, ValueError):
                return data
            if n.is_finite() and 0 < n < 1:
                return {**data, "gpu_count": 1, "gpu_fraction": n}
        return data

    @field_validator("gpu_types", mode="before")
    @classmethod
    def _no_gpu_type(cls, value: Any) -> Any:
        """`gpu_types: None`, `[]` or `["None"]` (the catalogue's "None (CPU only)" row,
        PRODUCT.md section 9): no GPU, a CPU-only job."""
        if value is None:
            return []
        if isinstance(value, list):
            return [t for t in value if not (isinstance(t, str) and t in CPU_ONLY_TYPES)]
        return value

    @field_validator("gpu_types")
    @classmethod
    def _known_gpu_types(cls, value: list[str], info: ValidationInfo) -> list[str]:
        """Each type as the catalogue names it; a loose or short name (catalog.py) stands
        for the one model it names."""
        known = catalog().model_names()
        named = {t: catalog().models_named(t) for t in value}
        unknown = [t for t, models in named.items() if not models]
        if unknown:
            raise PydanticCustomError(
                "unknown_gpu_type",
                "unknown GPU type(s): {unknown}",
                {"unknown": ", ".join(unknown), "rule": "R-JOB-2", "valid": ", ".join(known)},
            )
        ambiguous = {t: models for t, models in named.items() if len(models) > 1}
        if ambiguous:
            raise PydanticCustomError(
                "ambiguous_gpu_type",
                "ambiguous GPU type(s): {ambiguous}",
                {
                    "ambiguous": "; ".join(
                        f"{t} could be {' or '.join(m)}" for t, m in ambiguous.items()
                    ),
                    "rule": "R-JOB-2",
                    "valid": ", ".join(dict.fromkeys(m for ms in ambiguous.values() for m in ms)),
                },
            )
        value = [named[t][0] for t in value]
        count = info.data.get("gpu_count")
        if count == 0 and value:
            raise bad(
                "cpu_only_gpu_types",
                "a CPU-only job (gpu_count 0) uses no GPU: it names no GPU type",
                "R-JOB-2",
                "gpu_types: [] or None for a CPU-only job, or gpu_count >= 1",
            )
        if count is not None and count > 0 and not value:
            raise bad(
                "gpu_types_missing",
                "a GPU job needs one or more GPU types",
                "R-JOB-2",
                ", ".join(known),
            )
        return list(dict.fromkeys(value))

    @field_validator("gpu_fraction")
    @classmethod
    def _one_gpu_share(cls, value: Decimal | None, info: ValidationInfo) -> Decimal | None:
        if value is not None and info.data.get("gpu_count") not in (None, 1):
            raise bad(
                "fraction_count",
                "a fractional job uses a share of one GPU; gpu_count must be 1",
                "R-SCHED-4",
                "gpu_count: 0.5 (or gpu_count: 1 with gpu_fraction: 0.5)",
            )
        return value

    @field_validator("cpu_count")
    @classmethod
    def _cpu_multiple_of_4(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and value % 4:
            raise PydanticCustomError(
                "cpu_count_multiple",
                "cpu_count must be a multiple of 4, got {value}",
                {"value": value, "rule": "R-JOB-2", "valid": "4, 8, 12, ..."},
            )
        count = info.data.get("gpu_count")
        if value is not None and count is not None and count != 0:
            raise bad(
                "cpu_count_gpu_job",
                "cpu_count is for CPU-only jobs: a GPU job gets its GPUs' share of the node's CPUs",
                "R-JOB-2",
                "gpu_count: 0 with cpu_count, or no cpu_count",
            )
        return value

    @field_validator("workers")
    @classmethod
    def _workers_for_training(cls, value: int, info: ValidationInfo) -> int:
        if value > 1:
            _only_for(value, info, "workers > 1", "R-JOB-5", JobType.training)
        return value

    @field_validator("datasets")
    @classmethod
    def _datasets(cls, value: list[Dataset], info: ValidationInfo) -> list[Dataset]:
        _only_for(value, info, "datasets", "R-JOB-3", JobType.notebook, JobType.training)
        dup = _dups(dir_name(d.name) for d in value)
        if dup:
            raise bad(
                "dataset_unique",
                "two datasets would mount at the same directory: {dup}",
                "R-JOB-3",
                "names that differ after spaces become underscores",
                dup=", ".join(dup),
            )
        return value

    @field_validator("input_data")
    @classmethod
    def _input(cls, value: InputData | None, info: ValidationInfo) -> InputData | None:
        _only_for(value, info, "input_data", "R-JOB-3", JobType.inference)
        return value

    @field_validator("output_data")
    @classmethod
    def _output(cls, value: OutputData | None, info: ValidationInfo) -> OutputData | None:
        _only_for(value, info, "output_data", "R-JOB-3", JobType.training, JobType.inference)
        return value

    @field_validator("checkpoints")
    @classmethod
    def _checkpoints(cls, value: list[Checkpoint]) -> list[Checkpoint]:
        dup = _dups(dir_name(c.name) for c in value)
        if dup:
            raise bad(
                "checkpoint_unique",
                "two checkpoints would mount at the same directory: {dup}",
                "R-JOB-4",
                "names that differ after spaces become underscores",
                dup=", ".join(dup),
            )
        return value

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: EndpointSpec | None, info: ValidationInfo) -> EndpointSpec | None:
        t = _info_type(info)
        if t is JobType.endpoint and value is None:
            raise bad(
                "endpoint_required",
                "an endpoint job needs endpoint.server_command or endpoint.routes",
                "R-JOB-6",
                "endpoint: {routes: [...]} or {server_command: [...]}",
            )
        _only_for(value, info, "endpoint", "R-JOB-6", JobType.endpoint)
        if value is not None and value.routes and info.data.get("model") is None:
            raise bad(
                "routes_need_model",
                "routes name files of the model code; the job has no model",
                "R-JOB-6",
                "model: {source: git, path: https://...}",
            )
        return value

    @field_validator("environment")
    @classmethod
    def _environment(cls, value: Environment, info: ValidationInfo) -> Environment:
        if value.image is None:
            return value
        disk = info.data.get("disk_size_gb")
        if value.image_size_gb is not None and isinstance(disk, int) and value.image_size_gb > disk:
            raise bad(
                "image_too_big",
                "the image ({size} GB) does not fit the disk size ({disk} GB)",
                "R-JOB-7",
                f"disk_size_gb >= {value.image_size_gb}, or a smaller image",
                size=value.image_size_gb,
                disk=disk,
            )
        t = _info_type(info)
        needs = IMAGE_NEEDS.get(t.value, ()) if t is not None else ()
        have = {p.split("==")[0].split(">=")[0].strip().lower() for p in value.packages.pip}
        have |= {p.strip().lower() for p in value.image_packages}
        missing = [p for p in needs if p.lower() not in have]
        if missing and t is not None:
            raise bad(
                "image_needs",
                "a customer image for a {type} job needs {missing}",
                "R-JOB-7",
                "list them in image_packages (in the image) or packages.pip",
                type=t.value,
                missing=", ".join(missing),
            )
        return value

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        return env_names(value, "R-JOB-7")

    @field_validator("worker_commands")
    @classmethod
    def _per_worker(cls, value: list[list[str]], info: ValidationInfo) -> list[list[str]]:
        if not value:
            return value
        _only_for(value, info, "worker_commands", "R-JOB-5", JobType.training)
        workers = info.data.get("workers")
        if (isinstance(workers, int) and len(value) != workers) or any(not c for c in value):
            raise bad(
                "worker_commands",
                "worker_commands needs one non-empty command per worker ({workers})",
                "R-JOB-5",
                f"{workers} commands, or one `command` for all workers",
                workers=workers,
            )
        return value

    @field_validator("command")
    @classmethod
    def _command(cls, value: list[str], info: ValidationInfo) -> list[str]:
        per_worker = info.data.get("worker_commands")
        endpoint = info.data.get("endpoint")
        if value and per_worker:
            raise bad(
                "command_twice",
                "give one command for all workers or worker_commands, not both",
                "R-JOB-5",
                "command or worker_commands",
            )
        served = isinstance(endpoint, EndpointSpec) or _info_type(info) is JobType.notebook
        # An endpoint or worker_commands that failed their own checks are absent here: their
        # errors say it, not a missing command besides.
        checked = "worker_commands" in info.data and "endpoint" in info.data
        if not value and not per_worker and not served and checked:
            raise bad(
                "command_required",
                "a job needs a command (or worker_commands, or an endpoint; a notebook runs "
                "JupyterLab)",
                "R-JOB-5",
                "a command (after --)",
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
        regions = self.regions()
        if len(regions) > 1:
            raise bad(
                "regions_conflict",
                "the job is pinned to several regions: {regions}",
                "R-RES-1",
                MAX_PINNED,
                regions=", ".join(sorted(regions)),
            )
        return self

    @model_validator(mode="after")
    def _size(self) -> JobSpec:
        """The whole spec, as sent (gpufleet_contracts.limits): its events must fit NATS."""
        # model_dump_json's bytes, without decoding them (~3 us for a typical spec); an env
        # value counts as at least REDACTED's length, so the redacted spec fits too.
        size = len(self.__pydantic_serializer__.to_json(self, by_alias=True))
        size += sum(max(0, len(REDACTED) - len(v)) for v in self.env.values())
        if size > limits.SPEC_BYTES:
            raise PydanticCustomError(
                "too_big",
                "the job spec is {size} bytes of JSON, more than the cap of {limit}",
                {
                    "size": size,
                    "limit": limits.SPEC_BYTES,
                    "rule": "limit:spec_bytes",
                    "valid": f"at most {limits.SPEC_BYTES} bytes of JSON",
                },
            )
        return self

    # --- derived ---

    def redacted(self) -> JobSpec:
        """This spec with every env value replaced by REDACTED (the names kept): what events
        and replies carry (gpufleet_contracts.secrets)."""
        if not self.env:
            return self
        return self.model_copy(update={"env": redact_env(self.env)})

    def regions(self) -> set[str]:
        """Regions this job is pinned to by its regional resources (R-RES-1)."""
        found = {self.region} if self.region else set()
        for loc in (self.input_data, self.output_data):
            if loc is not None and loc.type is StorageType.regional_datastore and loc.region:
                found.add(loc.region)
        if self.reservation is not None:
            found.add(self.reservation.region)
        return found

    @property
    def pinned_region(self) -> str | None:
        regions = self.regions()
        return next(iter(regions)) if len(regions) == 1 else None

    @property
    def cpu_only(self) -> bool:
        """A CPU-only job (R-JOB-2): no GPU, `cpu_count` CPUs per worker."""
        return self.gpu_count == 0

    def command_for(self, worker: int) -> list[str]:
        """What `worker` runs: its own command, the shared one, or the endpoint's server."""
        if self.worker_commands:
            return self.worker_commands[worker]
        if self.command:
            return self.command
        if self.endpoint is not None and self.endpoint.server_command:
            return self.endpoint.server_command
        if self.type is JobType.notebook:
            return list(NOTEBOOK_COMMAND)  # the node adds where it listens (its socket)
        return ["python", "-m", "gpufleet_endpoint", "--port", "80"]
