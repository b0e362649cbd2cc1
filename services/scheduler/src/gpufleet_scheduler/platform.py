"""A node's requests for its placements' platform objects (R-JOB-3, R-JOB-4): the node never
holds the store's credentials and never chooses whose object it gets.

A request counts only from the node its subject names (`nrpc.scheduler.<verb>.<minion_id>`,
which only that node may publish) when that node holds the placement now, and only for an
object the job's own spec names (a source of its mount plan, or its `platform` output). The
account is the job's owner from the scheduler's record; the datastore, asked on a subject
only the scheduler may publish, answers the presigned URL. Anything else is "not found"."""

from __future__ import annotations

from typing import Protocol, TypeVar

from gpufleet_contracts import Message
from gpufleet_contracts.errors import NotFound
from gpufleet_contracts.locations import PlatformRef
from gpufleet_contracts.platform import (
    CompletePlatformObject,
    CompletePlatformUpload,
    GrantPlatformObject,
    PlatformGrant,
    PlatformObjectView,
    StagePlatformObject,
)
from gpufleet_contracts.states import WorkerState
from gpufleet_store import Doc
from pydantic import BaseModel

from . import jobdoc
from .jobrequest import spec_of
from .mounts import archive_name, plan
from .state import State

M = TypeVar("M", bound=BaseModel)


class Ask(Protocol):
    """Another service's answer to a message, as the reply model (a refusal: Refused)."""

    async def __call__(self, message: Message, reply: type[M]) -> M: ...


HOLDING = (WorkerState.placed.value, WorkerState.running.value, WorkerState.uploading.value)


class PlatformStaging:
    def __init__(self, state: State, ask: Ask) -> None:
        self.state = state
        self.ask = ask

    async def held(self, job_id: str, placement_id: str, worker: int, node: str) -> Doc:
        """The job whose worker `node` holds under `placement_id` now, or NotFound."""
        job = await self.state.db.jobs.find_one({"_id": job_id})
        w = jobdoc.find_worker(job, worker, placement_id)
        if job is None or w is None or w.get("minion_id") != node or w["state"] not in HOLDING:
            raise NotFound(f"no placement {placement_id} of worker {worker} on this node")
        return job

    async def stage(self, body: StagePlatformObject, node: str) -> PlatformGrant:
        job = await self.held(body.job_id, body.placement_id, body.worker, node)
        spec = spec_of(job, self.state.box)
        mounts = plan(spec, body.worker)
        public = False
        if body.mode == "read":
            named = {
                (m.source.asset, m.source.name)
                for m in mounts.mounts
                if isinstance(m.source, PlatformRef)
            }
            if body.name is None or (body.asset, body.name) not in named:
                raise NotFound(f"job {body.job_id} names no {body.asset.value} {body.name}")
            name = body.name
        else:
            out = mounts.output
            if not isinstance(out, PlatformRef) or out.asset != body.asset:
                raise NotFound(f"job {body.job_id} has no {body.asset.value} output")
            name = archive_name(spec.name, body.worker, spec.workers).removesuffix(".zip")
            public = out.public
        grant = GrantPlatformObject(
            account=job["owner"],
            asset=body.asset,
            name=name,
            mode=body.mode,
            job_id=body.job_id,
            worker=body.worker,
            public=public,
        )
        return await self.ask(grant, PlatformGrant)

    async def complete(self, body: CompletePlatformUpload, node: str) -> PlatformObjectView:
        job = await self.held(body.job_id, body.placement_id, body.worker, node)
        done = CompletePlatformObject(
            account=job["owner"], asset=body.asset, name=body.name, job_id=body.job_id
        )
        return await self.ask(done, PlatformObjectView)
