"""A worker's spec: what the agent keeps of its StartWorker, typed, frozen, and read once per
worker (written to `spec.json` with its directory, read back only after an agent restart).

Everything but the secrets: the env values (the names are kept, `env_names`), the registry
credential and the attached keys' values (their types are kept, `key_types`) go to the
worker's 0600 files instead (manager.py). `read` also takes the spec.json of an agent before
this format (a dict of StartWorker's fields with the mount sources and the output target as
strings) and upgrades it, so that a restarted agent re-attaches the workers an older one
started.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, Final, Literal

from gpufleet_contracts.endpoints import Reservation
from gpufleet_contracts.jobs import Mount, StartWorker
from gpufleet_contracts.jobspec import BaseEnvironment, Packages
from gpufleet_contracts.locations import OutputTarget, legacy_target
from gpufleet_contracts.serving import Serving
from pydantic import BaseModel, ConfigDict, Field, ValidationError

log = logging.getLogger("gpufleet.node_agent.workers")

SPEC_FILE = "spec.json"
FORMAT: Final = 2
STOP_GRACE_S = 10.0  # SIGTERM, then SIGKILL this much later


class WorkerSpec(BaseModel):
    """What a worker is to run, where and with what (StartWorker, less its secrets)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    format: Literal[2] = 2
    placement_id: str
    job_id: str
    job_name: str = ""
    worker: int
    command: tuple[str, ...] = ()  # empty: a placement stopped before it started
    env_names: tuple[str, ...] = ()
    gpu_indices: tuple[int, ...] = ()
    gpu_uuids: tuple[str, ...] = ()
    received_at: datetime | None = None
    # R-JOB-3/4: the mount plan, and where the output goes (typed: gpufleet_contracts.locations)
    mounts: tuple[Mount, ...] = ()
    output_archive: str | None = None
    output: OutputTarget | None = None
    gpu_fraction: Decimal | None = None  # R-SCHED-4: a share of its one GPU
    gpu_memory_limit_mb: int | None = None
    cpu_count: int | None = None  # a CPU-only worker's reserved CPUs (R-JOB-2)
    # R-JOB-7: its own image (its credential apart), the disk it must fit, its base
    # environment and packages
    image: str | None = None
    disk_size_gb: int = 10
    base_environment: BaseEnvironment | None = None
    packages: Packages = Field(default_factory=Packages)
    owner: str | None = None
    creator: str | None = None
    runtime: str = ""  # the runtime that runs it ("": the manager's default)
    key_types: tuple[str, ...] = ()  # R-JOB-7: its attached keys' types; the values in keys.json
    stop_grace_s: float = STOP_GRACE_S
    serving: Serving | None = None  # an endpoint's worker: how it serves (steps/serve.py)
    reservation: Reservation | None = None  # published with mDNS (steps/reservation.py)
    # the job's W3C trace context its StartWorker carried (gpufleet_bus.tracing): its
    # reports continue it
    trace: str | None = None

    @classmethod
    def of(
        cls, cmd: StartWorker, runtime: str, received_at: datetime, trace: str | None = None
    ) -> WorkerSpec:
        """The spec of `cmd` (its secrets opened or not: none of them is kept)."""
        return cls(
            trace=trace,
            placement_id=cmd.placement_id,
            job_id=cmd.job_id,
            job_name=cmd.job_name,
            worker=cmd.worker,
            command=tuple(cmd.command),
            env_names=tuple(sorted(cmd.env)),
            gpu_indices=tuple(cmd.gpu_indices),
            gpu_uuids=tuple(cmd.gpu_uuids),
            received_at=received_at,
            mounts=tuple(cmd.mounts),
            output_archive=cmd.output_archive,
            output=cmd.output,
            gpu_fraction=cmd.gpu_fraction,
            gpu_memory_limit_mb=cmd.gpu_memory_limit_mb,
            cpu_count=cmd.cpu_count,
            image=cmd.image,
            disk_size_gb=cmd.disk_size_gb,
            base_environment=cmd.base_environment,
            packages=cmd.packages,
            owner=cmd.owner,
            creator=cmd.creator,
            runtime=runtime,
            key_types=tuple(sorted(cmd.attached_keys)),
            serving=cmd.serving,
            reservation=cmd.reservation,
        )


def read(worker_dir: Path) -> WorkerSpec | None:
    """The spec in `worker_dir`'s spec.json, of this format or an older agent's (upgraded);
    None when it is missing or unreadable (logged)."""
    try:
        data = json.loads((worker_dir / SPEC_FILE).read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    if data.get("format") != FORMAT:
        data = upgrade(data, worker_dir)
    try:
        return WorkerSpec.model_validate(data)
    except ValidationError as exc:
        # What only its start needed (a launched worker needs none of it again) is dropped
        # rather than the worker: a rule tightened since it was written, say.
        dropped = {str(e["loc"][0]) for e in exc.errors() if e["loc"]} & _BEFORE_LAUNCH
        if not dropped or dropped != {str(e["loc"][0]) for e in exc.errors() if e["loc"]}:
            log.error("worker directory %s: spec.json is not a worker's spec: %s", worker_dir, exc)
            return None
        log.warning("worker directory %s: spec.json's %s dropped: %s", worker_dir, dropped, exc)
        return WorkerSpec.model_validate({k: v for k, v in data.items() if k not in dropped})


# What a worker needs only until it is launched.
_BEFORE_LAUNCH = frozenset({"mounts", "output", "base_environment", "packages", "image"})


def upgrade(data: dict[str, Any], worker_dir: Path) -> dict[str, Any]:
    """spec.json as an agent before this format wrote it, in this format: StartWorker's
    fields in a dict, the mount sources and the output target rendered as strings
    (`"dataset:coco"`, `output_upload: "aws:s3://b/out"`: typed here, as Mount and
    legacy_target read them), `command` None for a placement stopped before it started, and
    (before runtimes were chosen per worker) no `runtime`: podman's if it has podman's
    marker, else a bare process, the only runtime there was."""
    new = dict(data)
    runtime = new.get("runtime")
    if not isinstance(runtime, str) or not runtime:
        new["runtime"] = "podman" if (worker_dir / "container.json").exists() else "process"
    if new.get("command") is None:
        new["command"] = ()
    for name, f in WorkerSpec.model_fields.items():  # null where it has a default: the default
        if name in new and new[name] is None and f.default is not None and not f.is_required():
            del new[name]
    upload = new.pop("output_upload", None)
    if "output" not in new:
        try:
            new["output"] = legacy_target(upload) if isinstance(upload, str) else None
        except ValueError as exc:
            log.warning("worker directory %s: output target dropped: %s", worker_dir, exc)
            new["output"] = None
    new["format"] = FORMAT
    return new
