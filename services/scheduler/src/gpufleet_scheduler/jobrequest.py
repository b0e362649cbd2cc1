"""A job's request, in one typed form (`JobRequest`) and the one codec of its stored forms.

What a job asks for is stored in its document three ways, each written and read here only:

- `spec`: the spec minus the contract's defaults, every env value "<secret>" (`stored_spec`);
- `env_sealed`: the env values, a Fernet token made with the scheduler's key (R-JOB-7);
- `req`: what placement needs of the spec, small enough for checkpoints (which omit `spec`).

In memory the scheduler keeps one `JobRequest` per open job (state.py): the placement's part,
decoded once, and the opened spec once this process has it (a submission's, validated once;
or a stored job's, opened when it is placed).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

from gpufleet_contracts.jobs import JobSpec, JobType
from gpufleet_contracts.jobspec import BaseEnvironment, Environment
from gpufleet_contracts.secrets import redact_env
from gpufleet_store import Doc, SecretBox
from pydantic import ValidationError


@dataclass(frozen=True, slots=True)
class JobRequest:
    gpu_types: tuple[str, ...]
    gpu_count: int
    max_price: Decimal | None
    region: str | None  # the pinned region (R-RES-1)
    fraction: Decimal | None  # a share of one GPU (R-SCHED-4)
    project: str  # the project's name in its owner's account
    allow_burst: bool
    type: JobType
    cpu_count: int = 0  # a CPU-only job's CPUs per worker (R-JOB-2); 0: a GPU job
    # It carries secrets (env values, attached keys): only a node with a sealing key takes it.
    secrets: bool = False
    # Its base environment (R-JOB-7): only a node that offers it takes it. None: a customer
    # image (any node), or a job stored before it was kept whose spec is not at hand.
    environment: BaseEnvironment | None = None
    # The whole spec, secrets opened, when this process has it (never stored from here).
    spec: JobSpec | None = field(default=None, compare=False, repr=False)

    def with_spec(self, spec: JobSpec) -> JobRequest:
        return replace(self, spec=spec)


def of_spec(spec: JobSpec, project: str | None = None) -> JobRequest:
    return JobRequest(
        gpu_types=tuple(spec.gpu_types),
        gpu_count=spec.gpu_count,
        max_price=spec.max_price,
        region=spec.pinned_region,
        fraction=spec.gpu_fraction,
        project=project or spec.project,
        allow_burst=spec.allow_burst,
        type=spec.type,
        cpu_count=(spec.cpu_count or 0) if spec.cpu_only else 0,
        secrets=carries_secrets(spec),
        environment=spec.environment.base(),
        spec=spec,
    )


def carries_secrets(spec: JobSpec) -> bool:
    """Whether the job's workers may get secrets: env values, attached keys (keyuse.py)."""
    return bool(spec.env or spec.environment.keys)


# --- the stored forms ---------------------------------------------------------------


def encode(spec: JobSpec, project: str, box: SecretBox | None) -> Doc:
    """The fields of a new job's document that hold its request."""
    out: Doc = {"spec": stored_spec(spec), "req": encode_request(of_spec(spec, project))}
    if spec.env:
        if box is None:
            raise ValueError("a job with env values needs the scheduler's key to store them")
        out["env_sealed"] = box.seal_json(spec.env)
    return out


def encode_request(r: JobRequest) -> Doc:
    """`req`: what placement needs, as stored in the job and in checkpoints."""
    return {
        "gpu_types": list(r.gpu_types),
        "gpu_count": r.gpu_count,
        "max_price": None if r.max_price is None else str(r.max_price),
        "region": r.region,
        "fraction": None if r.fraction is None else str(r.fraction),
        "project": r.project,
        "allow_burst": r.allow_burst,
        "type": r.type.value,
        **({"cpu_count": r.cpu_count} if r.cpu_count else {}),
        "secrets": r.secrets,  # always: absent is a job stored before it was kept
        # always too: null is a customer image, absent a job stored before it was kept
        "environment": None
        if r.environment is None
        else r.environment.model_dump(mode="json", exclude_none=True),
    }


def decode(job: Doc) -> JobRequest:
    """A stored job's request (from `req`; a job written before `req` existed: its spec)."""
    req = job.get("req")
    if req is None:
        spec = JobSpec.model_validate(job["spec"])  # env values "<secret>": enough here
        return replace(of_spec(spec, job.get("project")), spec=None)
    return JobRequest(
        gpu_types=tuple(req["gpu_types"]),
        gpu_count=int(req["gpu_count"]),
        max_price=_dec(req.get("max_price")),
        region=req.get("region"),
        fraction=_dec(req.get("fraction")),
        project=req.get("project") or job.get("project") or "",
        allow_burst=bool(req.get("allow_burst")),
        type=JobType(req.get("type") or JobType.training.value),
        cpu_count=int(req.get("cpu_count") or 0),
        secrets=bool(req["secrets"]) if "secrets" in req else _may_carry_secrets(job),
        environment=_environment(req["environment"])
        if "environment" in req
        else _stored_environment(job),
    )


def _may_carry_secrets(job: Doc) -> bool:
    """A job stored before `req` said whether it carries secrets: from its spec; a
    checkpoint's copy of it (no spec) may, so it waits for a node that can receive them."""
    stored = job.get("spec")
    if stored is None:
        return True
    keys = (stored.get("environment") or {}).get("keys")
    return bool(job.get("env_sealed") or stored.get("env") or keys)


def _environment(stored: Doc | None) -> BaseEnvironment | None:
    if stored is None:
        return None
    return _base(
        str(stored["python_version"]), str(stored["framework"]), stored.get("framework_version")
    )


@functools.lru_cache(maxsize=1024)
def _base(python_version: str, framework: str, version: str | None) -> BaseEnvironment:
    """One object per triple (most jobs share the default), validated once."""
    return BaseEnvironment.model_validate(
        {"python_version": python_version, "framework": framework, "framework_version": version}
    )


def _stored_environment(job: Doc) -> BaseEnvironment | None:
    """A job stored before `req` kept its base environment: from its spec; a checkpoint's
    copy of it (no spec): None, any node, as it was placed when it was admitted."""
    stored = job.get("spec")
    if stored is None:
        return None
    try:
        return Environment.model_validate(stored.get("environment") or {}).base()
    except ValidationError:  # as it was placed when it was admitted
        return None


def stored_spec(spec: JobSpec) -> Doc:
    """The spec as a job document keeps it: what differs from the contract's defaults, with
    every env value replaced by "<secret>" (the values are in `env_sealed`).

    Read back with `spec_of`, it is the same spec (tests/unit/contracts/test_jobspec.py).
    Defaults are most of a spec (a typical one is 544 BSON bytes, 99 without them), and
    nx-27017's cost per stored job grows with its fields (benchmarks/scheduler). A contract
    default therefore never changes meaning within a version (`gpufleet_contracts.base`).
    """
    return spec.redacted().model_dump(mode="json", exclude_defaults=True)


def spec_of(job: Doc, box: SecretBox) -> JobSpec:
    """A stored job's spec with its secrets opened (SecretError: this key cannot open them).
    A job stored before secrets were sealed has its env in `spec` itself."""
    stored = job["spec"]
    if job.get("env_sealed"):
        stored = {**stored, "env": env_of(job, box)}
    return JobSpec.model_validate(stored)


def env_of(job: Doc, box: SecretBox) -> dict[str, str]:
    """A stored job's env values, opened (SecretError: this key cannot open them); empty for
    a job without any, or stored before they were sealed."""
    sealed = job.get("env_sealed")
    return dict(box.open_json(sealed)) if sealed else {}


def shown_spec(stored: Doc) -> Doc:
    """A stored spec with its defaults, as `gpufleet job show` prints it: env values
    "<secret>" (also those of a job stored before secrets were sealed)."""
    spec = JobSpec.model_validate(stored).model_dump(mode="json")
    spec["env"] = redact_env(spec.get("env") or {})
    return spec


def _dec(v: Any) -> Decimal | None:
    return None if v is None else Decimal(str(v))
