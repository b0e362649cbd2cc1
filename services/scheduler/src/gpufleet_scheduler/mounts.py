"""Each worker's mount plan (R-JOB-3, R-JOB-4): pure, from the spec alone.

- datasets (notebook/training): one at `/opt/ml/input`, several at
  `/opt/ml/input/<Name_With_Underscores>`; inference input data at `/opt/ml/input`
- checkpoints: one at `/opt/ml/checkpoint`, several at `/opt/ml/checkpoint/<Name>`
- model code at `/opt/ml/models`
- output at `/opt/ml/output` (ML_OUTPUT_PATH), uploaded as `<job_name>.zip`, or
  `<job_name>_<worker>.zip` for a multi-worker job

What fills each mount, and where the output goes, travel typed (gpufleet_contracts.locations),
never as strings. The node agent makes each target's directory (its inputs step) and exposes
it through the mount's `env` variable.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet_contracts.jobs import JobSpec, Mount, MountKind
from gpufleet_contracts.jobspec import dir_name
from gpufleet_contracts.locations import (
    OutputTarget,
    checkpoint_source,
    dataset_source,
    input_source,
    model_source,
    output_target,
)

INPUT = "/opt/ml/input"
CHECKPOINT = "/opt/ml/checkpoint"
MODELS = "/opt/ml/models"
OUTPUT = "/opt/ml/output"


@dataclass(frozen=True)
class MountPlan:
    mounts: tuple[Mount, ...]
    output_archive: str | None
    output: OutputTarget | None


def archive_name(job_name: str, worker: int, workers: int) -> str:
    """R-JOB-3: `<job_name>.zip`, or `<job_name>_<worker>.zip` for multi-worker jobs."""
    base = dir_name(job_name)
    return f"{base}.zip" if workers == 1 else f"{base}_{worker}.zip"


def _env_suffix(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in dir_name(name)).upper()


def plan(spec: JobSpec, worker: int) -> MountPlan:
    mounts: list[Mount] = []
    several = len(spec.datasets) > 1
    for ds in spec.datasets:
        target = f"{INPUT}/{dir_name(ds.name)}" if several else INPUT
        env = f"ML_DATA_PATH_{_env_suffix(ds.name)}" if several else "ML_DATA_PATH"
        mounts.append(
            Mount(target=target, kind=MountKind.dataset, source=dataset_source(ds), env=env)
        )
    if several:
        mounts.append(Mount(target=INPUT, kind=MountKind.dataset, env="ML_DATA_PATH"))
    if spec.input_data is not None:
        src = input_source(spec.input_data)
        mounts.append(Mount(target=INPUT, kind=MountKind.input, source=src, env="ML_DATA_PATH"))
    several = len(spec.checkpoints) > 1
    for ck in spec.checkpoints:
        target = f"{CHECKPOINT}/{dir_name(ck.name)}" if several else CHECKPOINT
        env = f"ML_CHECKPOINT_PATH_{_env_suffix(ck.name)}" if several else "ML_CHECKPOINT_PATH"
        mounts.append(
            Mount(target=target, kind=MountKind.checkpoint, source=checkpoint_source(ck), env=env)
        )
    if several:
        mounts.append(Mount(target=CHECKPOINT, kind=MountKind.checkpoint, env="ML_CHECKPOINT_PATH"))
    if spec.model is not None:
        mounts.append(
            Mount(
                target=MODELS,
                kind=MountKind.model,
                source=model_source(spec.model),
                env="ML_MODEL_PATH",
            )
        )
    mounts.append(
        Mount(target=OUTPUT, kind=MountKind.output, read_only=False, env="ML_OUTPUT_PATH")
    )
    out = None if spec.output_data is None else output_target(spec.output_data)
    archive = archive_name(spec.name, worker, spec.workers)
    return MountPlan(mounts=tuple(mounts), output_archive=archive, output=out)
