"""What a step is: one thing a worker needs before it runs (and gives back after it ends),
with a setup that makes it ready and a teardown that undoes or hands back what it made.

A step takes the worker (its typed spec, its directory), writes only inside the worker's
directory or what the worker owns on the node (its disk, its MPS share), and:

- `setup(w)` makes it ready, or raises `WorkerFailed(reason)` (the worker is reported failed
  with that reason and never launched). It may run again after an agent restart, so it is
  idempotent. What the launch needs of it (the image a container runs) it puts in
  `w.made[name]`, which its done-marker keeps across a restart.
- `teardown(w)` undoes it once the worker has ended, however it ended (failed before its
  launch too, or never set up at all): safe to call twice, quick when there is nothing to do.
- `marked`: whether a done-marker is kept for it (pipeline.py). A step that only makes what
  is missing (directories, files already written) is as cheap to run again as a marker is
  to write, and keeps none.

The worker manager runs the steps in the order its runtime declares (runtime's `steps`) and
tears them down in reverse (worker/pipeline.py); a runtime only runs the worker.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..worker.workdir import Worker


class StepName(StrEnum):
    keys = "keys"
    datastores = "datastores"
    image = "image"
    disk = "disk"
    share = "share"
    inputs = "inputs"
    outputs = "outputs"
    serve = "serve"
    reservation = "reservation"


class WorkerFailed(Exception):
    """The worker cannot run: `reason` is what its WorkerFinished says (never a secret)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Step(Protocol):
    @property
    def name(self) -> StepName: ...

    @property
    def marked(self) -> bool: ...

    async def setup(self, w: Worker) -> None: ...

    async def teardown(self, w: Worker) -> None: ...
