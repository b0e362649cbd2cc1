"""A worker's inputs (R-JOB-3, R-JOB-4): the directories its mount plan names made before it
runs, and what fills them fetched into them by the node's fetchers (staging/registry.py),
within what is left of its disk.

`strict` (the node's): every source must be fetchable, and a worker with one no fetcher
takes fails with the registry's reason. A `local` source is not a path on the node: its
fetcher (staging/local.py) waits for the user to send it (`gpufleet job connect`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from gpufleet_contracts.jobs import Mount

from ..staging.credentials import keys_of
from ..staging.registry import Fetchers, Moved, Progress, Transfer
from ..worker.layout import mount_dir
from .base import StepName
from .disk import IMAGE as DISK_IMAGE

if TYPE_CHECKING:
    from ..worker.workdir import Worker

log = logging.getLogger("gpufleet.node_agent.inputs")

GIB = 1024**3


def _unheard(moved: Moved) -> None:
    """Progress nobody shows."""


def used_bytes(d: Path) -> int:
    """What a worker's directory holds (its files' sizes, links not followed), but its
    quota filesystem (disk.py: the sparse image and what is mounted of it), which is the
    rest of its disk."""
    total = 0
    for root, dirs, files in os.walk(d):
        dirs[:] = [n for n in dirs if not os.path.ismount(os.path.join(root, n))]
        for name in files:
            if root == str(d) and name == DISK_IMAGE:
                continue
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total


def _emptied(d: Path) -> None:
    """A mount's directory as an earlier, interrupted try may have left it: emptied."""
    for child in list(d.iterdir()):
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


class InputsStep:
    """`dirs`: the directories the worker's runtime needs for its inputs (a bare worker:
    each mount's; a container: the read-only roots its binds show). `progress_for`: who
    hears how far a mount's fetch is. `writable`: the worker can write its inputs (a bare
    process): what the node's content cache holds is copied for it, not linked. `where`:
    the directory a mount's target is filled in (by default its own under the worker's
    `mnt/`; a container with the disk quota: its checkpoints on its quota filesystem)."""

    name = StepName.inputs

    def __init__(
        self,
        dirs: Callable[[Worker], Iterable[Path]],
        fetchers: Fetchers | None = None,
        *,
        strict: bool = True,
        progress_for: Callable[[Worker, Mount], Progress] | None = None,
        writable: bool = False,
        where: Callable[[Worker, str], Path] | None = None,
    ) -> None:
        self.dirs = dirs
        self.where = where or (lambda w, target: mount_dir(w.dir, target))
        self.fetchers = fetchers or Fetchers()
        self.strict = strict
        self.progress_for = progress_for or (lambda w, m: _unheard)
        self.writable = writable

    @property
    def marked(self) -> bool:
        """Only directories to make, without a fetcher: as cheap to make again."""
        return bool(self.fetchers.by_kind)

    async def setup(self, w: Worker) -> None:
        for d in self.dirs(w):
            d.mkdir(parents=True, exist_ok=True)
        for m in w.spec.mounts:
            if m.source is None:
                continue
            if not (self.strict or self.fetchers.takes(m.source)):
                continue
            dest = self.where(w, m.target)
            dest.mkdir(parents=True, exist_ok=True)
            await asyncio.to_thread(_emptied, dest)
            used = await asyncio.to_thread(used_bytes, w.dir)
            t = Transfer(
                keys=keys_of(w.dir),
                limit_bytes=max(0, w.spec.disk_size_gb * GIB - used),
                progress=self.progress_for(w, m),
                worker_dir=w.dir,
                writable=self.writable,
                job_id=w.job_id,
                placement_id=w.placement_id,
                worker=w.worker,
                mount=m.target,
                account=w.spec.owner,
            )
            await self.fetchers.fetch(m.source, dest, t)

    async def teardown(self, w: Worker) -> None:
        """Nothing: what was fetched goes with the worker's directory."""
