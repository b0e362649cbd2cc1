"""The region's datastores a worker reads or writes (R-RES-2: a `regional_datastore` input,
or an output put into one), mounted on the node before its inputs are fetched and held
until its output is put (mounts/keeper.py; the mount itself is the keeper's adapter).

While a datastore does not answer, the worker waits (`waiting: datastore nas unreachable`
in its staging, which `job show` prints) and the keeper's rounds try again; past `wait_s`
it fails with that reason. A datastore the node's region does not have fails it at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from gpufleet_contracts.jobs import StagingItem, StagingState
from gpufleet_contracts.locations import DatastoreRef

from ..mounts.keeper import DatastoreMounts
from ..mounts.port import NoDatastore, Unreachable
from ..staging.registry import Moved, Progress
from .base import StepName, WorkerFailed

if TYPE_CHECKING:
    from ..worker.workdir import Worker

WAIT_S = 600.0  # a worker waits this long for an unreachable datastore, then fails
POLL_S = 2.0


def datastores_of(w: Worker) -> list[str]:
    """The datastores the worker's mounts are filled from and its output goes to, once each."""
    refs: Iterator[object] = (m.source for m in w.spec.mounts)
    found = [r.datastore for r in (*refs, w.spec.output) if isinstance(r, DatastoreRef)]
    return list(dict.fromkeys(found))


class DatastoresStep:
    """`progress_for(w, item)`: who shows the worker's wait (its staging items)."""

    name = StepName.datastores
    marked = False  # holding a mount is as cheap to redo as a marker is to write

    def __init__(
        self,
        mounts: DatastoreMounts,
        progress_for: Callable[[Worker, StagingItem], Progress],
        *,
        wait_s: float = WAIT_S,
        poll_s: float = POLL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.mounts = mounts
        self.progress_for = progress_for
        self.wait_s = wait_s
        self.poll_s = poll_s
        self.clock = clock

    async def setup(self, w: Worker) -> None:
        for name in datastores_of(w):
            await self._hold(w, name)

    async def _hold(self, w: Worker, name: str) -> None:
        began = self.clock()
        told: Progress | None = None
        while True:
            try:
                await self.mounts.hold(name, w.key)
            except NoDatastore as exc:
                raise WorkerFailed(exc.reason) from None
            except Unreachable as exc:
                reason = self.mounts.reason(name) or exc.reason
                if self.clock() - began >= self.wait_s:
                    raise WorkerFailed(f"{reason} (waited {int(self.wait_s)} s)") from None
                if told is None:
                    item = StagingItem(
                        name=f"datastore {name}",
                        kind="datastore",
                        names=f"datastore {name}",
                        state=StagingState.waiting,
                    )
                    told = self.progress_for(w, item)
                told(Moved(0, None, waiting=True, reason=reason))
                await asyncio.sleep(self.poll_s)
                continue
            if told is not None:
                told(Moved(1, 1))  # it answers: the wait is over
            return

    async def teardown(self, w: Worker) -> None:
        for name in datastores_of(w):
            await self.mounts.release(name, w.key)
