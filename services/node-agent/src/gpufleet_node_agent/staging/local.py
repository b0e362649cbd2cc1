"""`local` data (R-JOB-3, R-JOB-4): files on the user's own machine, which the node never
reaches (nor the user's machine the node). `gpufleet job connect` puts them in the control
plane's relay, the platform's object store (gpufleet_contracts.localdata), and the node gets
them from there as it gets a `platform` object (platform.py: the same store guard, presigned
URLs asked of the scheduler for a placement this node holds, never logged).

A fetch asks the scheduler (StageLocalData) for the mount's file; while the user has not
sent it the answer is `waiting`: the worker's staging says so ("waiting for you to connect")
and the node asks again every POLL_S, for as long as the job lasts (the user may cancel it;
the worker is billed meanwhile, as a started worker is). A `local` output is put in the relay
when the worker ends, as a `platform` output is, and `job connect` downloads it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from gpufleet_contracts.localdata import (
    OUTPUT,
    CompleteLocalUpload,
    LocalStage,
    RelayedView,
    RelayGrant,
    StageLocalData,
)
from gpufleet_contracts.locations import LocalSource, OutputTarget, Source

from ..steps.base import WorkerFailed
from .platform import Platform, placement_of, verified
from .registry import Moved, Transfer

POLL_S = 5.0


@dataclass(frozen=True)
class LocalRelay:
    platform: Platform  # how this node asks the scheduler and reaches the store
    poll_s: float = POLL_S

    async def _stage(self, t: Transfer, mount: str, mode: str, what: str) -> LocalStage:
        job_id, placement_id = placement_of(t, what)
        asked = StageLocalData(
            job_id=job_id,
            placement_id=placement_id,
            worker=t.worker,
            mount=mount,
            mode="read" if mode == "read" else "write",
        )
        return await self.platform.answer(asked, LocalStage, what, "refused")

    @staticmethod
    def _granted(staged: LocalStage, method: str, what: str) -> RelayGrant:
        if staged.grant is None or staged.grant.method != method:
            raise WorkerFailed(f"{what}: the control plane granted no {method}")
        return staged.grant

    async def fetch(self, source: Source, dest: Path, t: Transfer) -> None:
        assert isinstance(source, LocalSource)
        what = f"local {source.path}"
        if t.mount is None:
            raise WorkerFailed(f"{what}: no mount to ask for it")
        while True:
            staged = await self._stage(t, t.mount, "read", what)
            if staged.state == "ready":
                break
            t.progress(Moved(0, None, waiting=True))
            await asyncio.sleep(self.poll_s)
        grant = self._granted(staged, "GET", what)
        await self.platform.download(grant.url, grant.name, dest, t, what)

    async def put(self, path: Path, target: OutputTarget, t: Transfer) -> None:
        assert isinstance(target, LocalSource)
        what = f"local output {path.name}"
        grant = self._granted(await self._stage(t, OUTPUT, "write", what), "PUT", what)
        size, sha = await self.platform.upload(path, grant.url, t, what)
        done = CompleteLocalUpload(
            job_id=t.job_id or "", placement_id=t.placement_id or "", worker=t.worker
        )
        view = await self.platform.answer(done, RelayedView, what, "upload not verified")
        verified(what, view.state, view.size, view.sha256, size, sha)
