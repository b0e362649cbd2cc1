"""A worker's outputs (R-JOB-3): the writable directories it leaves its output and
checkpoints in, made before it runs; once it has ended, what it left there kept in its
directory (copied off its quota filesystem, steps/disk.py) and, when the job names an output
target and the node has an uploader for its kind (staging/registry.py), zipped with its
manifest (outzip.py) and put there.

While it is put the worker is `uploading` (the manager reports it from `w.uploading_at`).
A put that fails fails the worker ("output upload to <target>: <why>", in `upload_failed`)
and the archive stays on the node under `<state_dir>/kept-outputs/<placement>/` for
GPUFLEET_KEPT_OUTPUTS_HOURS (`prune_kept`). Idempotent: once put (`uploaded`) or failed,
never again; an agent that restarts in the middle zips and puts it again (an uploader puts
under the archive's name, over what a cut-short try left).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from gpufleet_contracts.clock import utcnow

from ..staging.credentials import keys_of
from ..staging.registry import Transfer, Uploaders
from ..worker import progress
from ..worker.files import write_text_atomic
from ..worker.layout import (
    KEPT_OUTPUTS_DIR,
    OUTPUT_DIR,
    UPLOAD_DIR,
    UPLOAD_FAILED,
    UPLOADED,
    kept_output_dir,
)
from . import disk, outzip
from .base import StepName, WorkerFailed

if TYPE_CHECKING:
    from ..worker.workdir import Worker

log = logging.getLogger("gpufleet.node_agent.workers")


class OutputsStep:
    """`dirs`: the writable directories its runtime needs (a bare worker: its output
    directory, its working directory too; a container without a quota filesystem: the
    writable binds' sources, owned by `uid`); `quota`: its output may be on a quota
    filesystem, kept before the disk step's teardown releases it."""

    name = StepName.outputs
    marked = False  # directories: as cheap to make again

    def __init__(
        self,
        dirs: Callable[[Worker], Iterable[Path]],
        uploaders: Uploaders | None = None,
        *,
        uid: int | None = None,
        quota: bool = False,
    ) -> None:
        self.dirs = dirs
        self.uploaders = uploaders or Uploaders()
        self.uid = uid
        self.quota = quota

    async def setup(self, w: Worker) -> None:
        for d in self.dirs(w):
            d.mkdir(parents=True, exist_ok=True)
            if self.uid is not None and os.geteuid() == 0:
                os.chown(d, self.uid, self.uid)

    async def teardown(self, w: Worker) -> None:
        if self.quota:
            kept = disk.to_keep(w.dir)
            if kept:
                await asyncio.to_thread(disk.keep, w.dir, kept)
        target = w.spec.output
        if target is None or not self.uploaders.takes(target) or not to_put(w):
            return
        archive = w.spec.output_archive or f"{w.job_id}.zip"
        path = w.file(UPLOAD_DIR) / archive
        limit = disk.size_bytes(w.spec.disk_size_gb)  # its quota filesystem's size
        w.uploading_at = w.uploading_at or utcnow()
        told = progress.upload_progress(w, archive, target)
        try:
            await asyncio.to_thread(outzip.archive, w.file(OUTPUT_DIR), path, limit)
            t = Transfer(
                keys_of(w.dir),
                limit,
                told,
                worker_dir=w.dir,
                job_id=w.job_id,
                placement_id=w.placement_id,
                worker=w.worker,
                account=w.spec.owner,
            )
            await self.uploaders.put(path, target, t)
        except WorkerFailed as exc:
            self._failed(w, path, f"output upload to {progress.named(target)}: {exc.reason}")
            return
        except Exception as exc:  # an uploader's own bug, or the host: said, not hidden
            log.exception("worker %s: uploading its output failed", w.key)
            self._failed(w, path, f"output upload to {progress.named(target)}: {exc}")
            return
        progress.ended(w, archive, ok=True)
        w.file(UPLOADED).touch()
        shutil.rmtree(w.file(UPLOAD_DIR), ignore_errors=True)

    def _failed(self, w: Worker, path: Path, reason: str) -> None:
        """The worker fails with `reason`; its archive (if made) is kept off its directory."""
        progress.ended(w, path.name, ok=False)
        if path.exists():
            kept = kept_output_dir(w.dir)
            kept.mkdir(parents=True, exist_ok=True)
            os.replace(path, kept / path.name)
            reason += f" (the archive is kept on the node in {kept})"
        write_text_atomic(w.file(UPLOAD_FAILED), reason)
        log.warning("worker %s: %s", w.key, reason)


def to_put(w: Worker) -> bool:
    """Whether the worker's output is still to be put: its command ran (and was not
    stopped: a cancel wants the worker over now), and no earlier teardown put it or failed."""
    if w.file(UPLOADED).exists() or w.file(UPLOAD_FAILED).exists():
        return False
    return w.file("started.json").exists() and not w.file("stop_requested").exists()


def prune_kept(state_dir: Path, max_age_s: float, now: float | None = None) -> list[str]:
    """Remove the kept archives older than `max_age_s` (by their directory's time); the
    placements removed."""
    root = state_dir / KEPT_OUTPUTS_DIR
    if not root.is_dir():
        return []
    now = time.time() if now is None else now
    gone = []
    for d in sorted(root.iterdir()):
        try:
            old = now - d.lstat().st_mtime > max_age_s
        except OSError:
            continue
        if old:
            if d.is_dir() and not d.is_symlink():
                shutil.rmtree(d, ignore_errors=True)
            else:
                d.unlink(missing_ok=True)
            gone.append(d.name)
    return gone
