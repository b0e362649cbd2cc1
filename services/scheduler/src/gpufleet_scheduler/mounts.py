"""Each worker's mount plan (R-JOB-3, R-JOB-4): pure, from the spec alone.

- datasets (notebook/training): one at `/opt/ml/input`, several at
  `/opt/ml/input/<Name_With_Underscores>`; inference input data at `/opt/ml/input`
- checkpoints: one at `/opt/ml/checkpoint`, several at `/opt/ml/checkpoint/<Name>`
- model code at `/opt/ml/models`
- output at `/opt/ml/output` (ML_OUTPUT_PATH), uploaded as `<job_name>.zip`, or
  `<job_name>_<worker>.zip` for a multi-worker job

The node agent creates each target under the worker's directory and exposes it through the
mount's `env` variable (real bind mounts need containers, which this release does not run).
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet_contracts.jobs import JobSpec, Mount
from gpufleet_contracts.jobspec import dir_name

INPUT = "/opt/ml/input"
CHECKPOINT = "/opt/ml/checkpoint"
MODELS = "/opt/ml/models"
OUTPUT = "/opt/ml/output"


@dataclass(frozen=True)
class MountPlan:
    mounts: tuple[Mount, ...]
    output_archive: str | None
    output_upload: str | None


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
        origin = "public dataset" if ds.public else "dataset"
        mounts.append(Mount(target=target, kind="dataset", source=f"{origin}:{ds.name}", env=env))
    if several:
        mounts.append(Mount(target=INPUT, kind="dataset", source="datasets", env="ML_DATA_PATH"))
    if spec.input_data is not None:
        src = f"{spec.input_data.type.value}:{spec.input_data.path}"
        if spec.input_data.datastore:
            src = f"regional_datastore:{spec.input_data.datastore}:{spec.input_data.path}"
        mounts.append(Mount(target=INPUT, kind="input", source=src, env="ML_DATA_PATH"))
    several = len(spec.checkpoints) > 1
    for ck in spec.checkpoints:
        target = f"{CHECKPOINT}/{dir_name(ck.name)}" if several else CHECKPOINT
        env = f"ML_CHECKPOINT_PATH_{_env_suffix(ck.name)}" if several else "ML_CHECKPOINT_PATH"
        origin = "public checkpoint" if ck.public else "checkpoint"
        mounts.append(
            Mount(target=target, kind="checkpoint", source=f"{origin}:{ck.name}", env=env)
        )
    if several:
        mounts.append(
            Mount(
                target=CHECKPOINT, kind="checkpoint", source="checkpoints", env="ML_CHECKPOINT_PATH"
            )
        )
    if spec.model is not None:
        mounts.append(
            Mount(
                target=MODELS,
                kind="model",
                source=f"{spec.model.source.value}:{spec.model.path}",
                env="ML_MODEL_PATH",
            )
        )
    mounts.append(
        Mount(target=OUTPUT, kind="output", source="worker", read_only=False, env="ML_OUTPUT_PATH")
    )
    out = spec.output_data
    upload = None if out is None else f"{out.type.value}:{out.path}"
    archive = archive_name(spec.name, worker, spec.workers)
    return MountPlan(mounts=tuple(mounts), output_archive=archive, output_upload=upload)
