"""Where a worker's things are in its directory, `<state_dir>/workers/<placement>/`, whatever
runtime runs it (the runtimes' own files: their modules)."""

from __future__ import annotations

from pathlib import Path

MOUNTS_DIR = "mnt"  # a mount's target /opt/ml/... lives under <worker_dir>/mnt/opt/ml/...
OUTPUT_DIR = "output"  # ML_OUTPUT_PATH of a bare worker; what a container's output is kept in
ENV_FILE = "env.json"  # the job's env values: 0600, deleted by the runtime as it launches
UPLOAD_DIR = "upload"  # the output's archive while it is put (steps/outputs.py)
UPLOADED = "uploaded"  # the output was put: not again after an agent restart
UPLOAD_FAILED = "upload_failed"  # why the output could not be put: the worker failed
# Beside `workers/` in the agent's state directory: archives whose upload failed, by
# placement, for GPUFLEET_KEPT_OUTPUTS_HOURS.
KEPT_OUTPUTS_DIR = "kept-outputs"


def mount_dir(worker_dir: Path, target: str) -> Path:
    """Where the mount at `target` (/opt/ml/input/coco) lives under the worker's directory;
    `.` and `..` are dropped, so it is never outside."""
    rel = [p for p in target.split("/") if p and p not in (".", "..")]
    return worker_dir.joinpath(MOUNTS_DIR, *rel)


def kept_output_dir(worker_dir: Path) -> Path:
    """`<state_dir>/kept-outputs/<placement>/`: where a worker's output archive stays when
    its upload failed (its directory is `<state_dir>/workers/<placement>/`)."""
    return worker_dir.parent.parent / KEPT_OUTPUTS_DIR / worker_dir.name
