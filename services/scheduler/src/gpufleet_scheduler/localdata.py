"""A job's `local` data (R-JOB-3, R-JOB-4) relayed through the platform's object store
between the user's machine (`gpufleet job connect`) and the node
(gpufleet_contracts.localdata): who may put or read which file.

The user's requests count for a job of the account of their subject only (any other job is
"not found", as `get_job` answers), and only for a `local` mount the job's spec names. A
node's count from the node holding the placement now (PlatformStaging.held), reading a
`local` input mount of its job or writing its `local` output. The datastore, asked on
subjects only the scheduler may publish, grants the presigned URLs for the job's owner."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from gpufleet_contracts.errors import NotFound, Refused
from gpufleet_contracts.jobs import JobSpec, JobState
from gpufleet_contracts.localdata import (
    OUTPUT,
    CompleteLocalUpload,
    CompleteRelay,
    ConnectJob,
    GrantRelay,
    ListRelayed,
    LocalConnection,
    LocalDataSent,
    LocalMountView,
    LocalStage,
    RelayedList,
    RelayedView,
    RelayGrant,
    StageLocalData,
)
from gpufleet_contracts.locations import LocalSource
from gpufleet_store import Doc

from .jobrequest import spec_of
from .mounts import archive_name, plan
from .platform import Ask
from .state import State

# the job whose worker the asking node holds under the placement now, or NotFound
Held = Callable[[str, str, int, str], Awaitable[Doc]]


def local_mounts(spec: JobSpec) -> list[LocalMountView]:
    """The `local` mounts of a job: its inputs (the same for every worker), then its output."""
    mounts = plan(spec, 0)
    found = [
        LocalMountView(mount=m.target, path=m.source.path, direction="input")
        for m in mounts.mounts
        if isinstance(m.source, LocalSource)
    ]
    if isinstance(mounts.output, LocalSource):
        found.append(LocalMountView(mount=OUTPUT, path=mounts.output.path, direction="output"))
    return found


def _input(mounts: list[LocalMountView], mount: str, job_id: str) -> LocalMountView:
    for m in mounts:
        if m.mount == mount and m.direction == "input":
            return m
    raise NotFound(f"job {job_id} has no local data for {mount}")


class LocalRelay:
    def __init__(self, state: State, ask: Ask, held: Held) -> None:
        self.state = state
        self.ask = ask
        self.held = held

    async def _own(self, job_id: str, account: str) -> tuple[Doc, JobSpec]:
        job = await self.state.db.jobs.find_one({"_id": job_id, "owner": account})
        if job is None:
            raise NotFound(f"no job {job_id}")
        return job, spec_of(job, self.state.box)

    # --- the user's (`job connect`) ----------------------------------------------------------

    async def connect(self, body: ConnectJob, account: str) -> LocalConnection:
        job, spec = await self._own(body.job_id, account)
        mounts = local_mounts(spec)
        if not mounts:
            raise Refused("invalid", f"job {body.job_id} has no local data to connect")
        for f in body.sending:
            _input(mounts, f.mount, body.job_id)
        if body.sending and JobState(job["state"]).terminal:
            raise Refused("conflict", f"job {body.job_id} has ended: nothing to send it")
        owner = job["owner"]
        uploads: list[RelayGrant] = []
        for f in body.sending:
            write = GrantRelay(
                account=owner, job_id=body.job_id, mount=f.mount, name=f.name, mode="write"
            )
            staged = await self.ask(write, LocalStage)
            if staged.grant is not None:
                uploads.append(staged.grant)
        relayed = await self.ask(ListRelayed(account=owner, job_id=body.job_id), RelayedList)
        downloads: list[RelayGrant] = []
        views: list[LocalMountView] = []
        for m in mounts:
            sent = [r for r in relayed.relayed if r.mount == m.mount]
            ready = [r for r in sent if r.state == "ready"]
            state = "ready" if ready else "uploading" if sent else "waiting"
            size = ready[0].size if ready and m.direction == "input" else None
            views.append(m.model_copy(update={"state": state, "size": size}))
            for r in ready if m.direction == "output" else []:
                read = GrantRelay(
                    account=owner, job_id=body.job_id, mount=OUTPUT, worker=r.worker, mode="read"
                )
                staged = await self.ask(read, LocalStage)
                if staged.grant is not None:
                    downloads.append(staged.grant)
        outputs = spec.workers if any(m.direction == "output" for m in mounts) else 0
        return LocalConnection(
            job_id=body.job_id,
            job_name=spec.name,
            state=job["state"],
            mounts=views,
            uploads=uploads,
            downloads=downloads,
            outputs_expected=outputs,
        )

    async def sent(self, body: LocalDataSent, account: str) -> LocalMountView:
        job, spec = await self._own(body.job_id, account)
        mount = _input(local_mounts(spec), body.mount, body.job_id)
        done = CompleteRelay(account=job["owner"], job_id=body.job_id, mount=body.mount)
        stored = await self.ask(done, RelayedView)
        return mount.model_copy(update={"state": stored.state, "size": stored.size})

    # --- a node's --------------------------------------------------------------------------

    async def stage(self, body: StageLocalData, node: str) -> LocalStage:
        job = await self.held(body.job_id, body.placement_id, body.worker, node)
        spec = spec_of(job, self.state.box)
        mounts = local_mounts(spec)
        if body.mode == "read":
            _input(mounts, body.mount, body.job_id)
            read = GrantRelay(
                account=job["owner"], job_id=body.job_id, mount=body.mount, mode="read"
            )
            return await self.ask(read, LocalStage)
        if body.mount != OUTPUT or not any(m.direction == "output" for m in mounts):
            raise NotFound(f"job {body.job_id} has no local output")
        write = GrantRelay(
            account=job["owner"],
            job_id=body.job_id,
            mount=OUTPUT,
            worker=body.worker,
            name=archive_name(spec.name, body.worker, spec.workers),
            mode="write",
        )
        return await self.ask(write, LocalStage)

    async def complete(self, body: CompleteLocalUpload, node: str) -> RelayedView:
        job = await self.held(body.job_id, body.placement_id, body.worker, node)
        if not any(m.direction == "output" for m in local_mounts(spec_of(job, self.state.box))):
            raise NotFound(f"job {body.job_id} has no local output")
        done = CompleteRelay(
            account=job["owner"], job_id=body.job_id, mount=OUTPUT, worker=body.worker
        )
        return await self.ask(done, RelayedView)
