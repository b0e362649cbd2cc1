"""A worker's outputs (R-JOB-3): the writable directories it leaves its output and
checkpoints in, made before it runs; once it has ended, what it left there kept in its
directory (copied off its quota filesystem, steps/disk.py) and put where the job says by
the node's uploaders (staging/registry.py).

The node has no uploader yet: the output stays in the worker's directory on the node, as
before staging existed (`output_archive` and the output target are in its spec).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from ..staging.registry import Moved, Uploaders
from ..worker.layout import OUTPUT_DIR
from . import disk
from .base import StepName

if TYPE_CHECKING:
    from ..worker.workdir import Worker


def _unheard(moved: Moved) -> None:
    """Progress nobody shows yet."""


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
        if target is not None and self.uploaders.takes(target):
            await self.uploaders.put(w.file(OUTPUT_DIR), target, _unheard)
