"""Where a worker's things are in its directory, `<state_dir>/workers/<placement>/`, whatever
runtime runs it (the runtimes' own files: their modules)."""

from __future__ import annotations

from pathlib import Path

MOUNTS_DIR = "mnt"  # a mount's target /opt/ml/... lives under <worker_dir>/mnt/opt/ml/...
OUTPUT_DIR = "output"  # ML_OUTPUT_PATH of a bare worker; what a container's output is kept in
ENV_FILE = "env.json"  # the job's env values: 0600, deleted by the runtime as it launches


def mount_dir(worker_dir: Path, target: str) -> Path:
    """Where the mount at `target` (/opt/ml/input/coco) lives under the worker's directory;
    `.` and `..` are dropped, so it is never outside."""
    rel = [p for p in target.split("/") if p and p not in (".", "..")]
    return worker_dir.joinpath(MOUNTS_DIR, *rel)
