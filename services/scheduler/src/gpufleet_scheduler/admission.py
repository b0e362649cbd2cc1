"""Admission: a submitted job checked against the rules that need the fleet and the store
(its project R-TEN-1, its owner's plan R-TEN-3, its region R-RES-1, its base environment and
its creator's attached keys R-JOB-7), given its token if it is a notebook (R-JOB-1), then
handed to the next placement pass, which stores it with its placement or its reason to wait
(passes.py)."""

from __future__ import annotations

import asyncio
import hashlib
import uuid

from gpufleet_bus import tracing
from gpufleet_contracts import FieldError
from gpufleet_contracts.errors import NotFound, Refused
from gpufleet_contracts.jobs import JobSpec
from gpufleet_store import Doc

from . import environments, jobdoc, keyuse, notebooks, projects, tenancy
from .keystore import KeyStore
from .passes import Passes
from .state import State
from .submissions import Submission


class Admission:
    def __init__(
        self, state: State, passes: Passes, projects: projects.Projects, keys: KeyStore
    ) -> None:
        self.state = state
        self.passes = passes
        self.projects = projects
        self.keys = keys
        self._pending: dict[str, asyncio.Future[bool]] = {}  # job id -> its submission

    async def submit(
        self, spec: JobSpec, account: str, wait: bool = True, request_id: str | None = None
    ) -> Doc:
        """Queue a job for `account` (its creator) in the project its spec names (R-TEN-1):
        owned by that project's owner; returns its view (jobdoc.view). With `request_id`
        (EnqueueJob, or a SubmitJob that carries one) the id is derived from it, and a job
        already queued for the same account and request is returned instead of a new one
        (one stored meanwhile by another instance too: store_unplaced).

        The job joins the next placement pass, which stores it in the same transaction as
        its placement (or its reason to wait): one write per job. An instance that does not
        lead stores it alone and tells the leader."""
        st = self.state
        job_id = "j" + uuid.uuid4().hex[:12]
        if request_id is not None:
            job_id = "j" + hashlib.sha256(f"{account}\n{request_id}".encode()).hexdigest()[:12]
            pending = self._pending.get(job_id)
            if pending is not None:  # the same request twice at once: one job
                await asyncio.shield(pending)
                return jobdoc.view(await st.find_job(job_id, account))
            existing = await st.db.jobs.find_one({"_id": job_id})
            if existing is not None:
                return jobdoc.view(_created_by(existing, account))
        spec = notebooks.with_token(spec)  # a notebook's, sealed with its env from here on
        owner, project = await self.projects.resolve(spec.project, account)
        await self.projects.check_live(spec.project, owner, account)  # R-TEN-1
        await self.projects.check_plan(owner, tenancy.regional_uses(spec))  # R-TEN-3
        await self._check_region(spec, owner)
        await self._check_environment(spec)
        await self._check_keys(spec, account)
        if owner == account:  # created on first use; another's exists (resolve found it)
            await self.projects.ensure(owner, project)
        # The job's trace begins here, sampled or not (gpufleet_bus.tracing), and is stored
        # with it: its placement, its node's steps and its ledger entry continue it.
        with tracing.root("submit job", {"gpufleet.job.id": job_id}) as trace:
            now = st.clock()
            doc = jobdoc.new_job(
                job_id, spec, account, now, request_id, owner=owner, project=project, box=st.box
            )
            doc["trace"] = trace
            fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
            self._pending[job_id] = fut
            self.passes.add(Submission(doc, spec, fut))
            try:
                considered = await fut
            finally:
                self._pending.pop(job_id, None)
            if wait and not considered:
                await self.passes.request_pass()
            cached = st.jobs.get(job_id) if st.loaded else None
            if cached is None:  # the leader knows it: no read needed
                cached = await st.db.jobs.find_one({"_id": job_id})
            if cached is None:
                raise NotFound(f"job {job_id} not found")
            return jobdoc.view(_created_by(cached, account))

    async def _check_keys(self, spec: JobSpec, account: str) -> None:
        """R-JOB-7: every key the job names is attached to its creator's account (or, for a
        registry key, carried in its env the old way: keyuse.py)."""
        if not spec.environment.keys:
            return
        stored = await self.keys.types_of(account)
        missing = keyuse.unattached(spec.environment.keys, stored, spec.env)
        if missing:
            raise keyuse.refusal(account, missing, stored)

    async def _check_environment(self, spec: JobSpec) -> None:
        """R-JOB-7: refuse a base environment that no node offers (environments.py says
        which nodes count: not removed, in the pinned region; none: what every node builds).
        One node that offers it is enough, found by a query or three; only a refusal reads
        them all."""
        base = spec.environment.base()
        if base is None:
            return
        nodes = self.state.db.nodes
        scope: dict[str, object] = {"state": {"$ne": "removed"}}
        if spec.pinned_region is not None:
            scope["region"] = spec.pinned_region
        for offering in environments.offering(base):
            if await nodes.find_one({**scope, **offering}, {"_id": 1}) is not None:
                return
        offers = environments.fleet_offers(
            [n.get("environments") async for n in nodes.find(scope, {"environments": 1})]
        )
        refused = environments.refusal(base, offers, spec.pinned_region)
        if refused is not None:
            raise refused

    async def _check_region(self, spec: JobSpec, owner: str) -> None:
        """R-RES-1: refuse a pin to a region of the job's owner that has none of the job's GPU
        types (for a CPU-only job: no node that offers CPUs to CPU-only jobs). Region names
        are unique per owner only: another account's region of the same name is not it."""
        region = spec.pinned_region
        if region is None:
            return
        nodes = self.state.db.nodes
        live: dict[str, object] = {"owner": owner, "state": {"$ne": "removed"}}
        if spec.cpu_only:
            live["cpus"] = {"$gt": 0}
            types = "node offering CPUs to CPU-only jobs"
        else:
            live["gpu_model"] = {"$in": spec.gpu_types}
            types = " or ".join(spec.gpu_types)
        if await nodes.find_one({"region": region, **live}) is not None:
            return
        having = sorted({n["region"] async for n in nodes.find(live)})
        raise Refused(
            "invalid",
            f"region {region} has no {types}: the job would never start",
            [
                FieldError(
                    field="spec.region",
                    rule="R-RES-1",
                    message=f"region {region} has no {types}" + ("" if spec.cpu_only else " node"),
                    valid=(
                        "a region of yours with " + types + ": " + ", ".join(having)
                        if having
                        else f"no region of yours has {types} yet"
                    ),
                )
            ],
        )


def _created_by(job: Doc, account: str) -> Doc:
    """`job`, the one a request id of `account` names: a job of another account with the
    same derived id (a hash collision, 48 bits) is refused, never shown (R-TEN-2)."""
    if job.get("creator") != account:
        raise Refused.of_field(
            "conflict",
            "this request id cannot be used (its job id is taken): send another",
            field="request_id",
            rule="R-TEN-2",
            says="choose another request id",
        )
    return job
