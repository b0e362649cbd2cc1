"""Composition root of the scheduler: ports in, the service out, every subject wired here."""

from __future__ import annotations

from datetime import timedelta

from faststream.nats import NatsBroker
from gpufleet_bus import (
    Asker,
    Batched,
    Delivery,
    Every,
    Ports,
    Request,
    Service,
    ServiceRuntime,
    publish,
)
from gpufleet_contracts import Message, subjects
from gpufleet_contracts.devices import DeviceKeys, GetDeviceKeys, StageDeviceCheckpoint
from gpufleet_contracts.identity import AccountChanged, AccountRemoved
from gpufleet_contracts.jobs import (
    CancelJob,
    EnqueueJob,
    GetJob,
    GetJobLogs,
    JobAccepted,
    JobList,
    JobLogs,
    JobQueued,
    JobRejected,
    JobStateChanged,
    JobView,
    ListAllJobs,
    ListJobs,
    PendingDemandChanged,
    SchedulerSync,
    StartWorker,
    StopWorker,
    SubmitJob,
    WorkerFinished,
    WorkerPlaced,
    WorkerStaging,
    WorkerStarted,
    WorkerUploading,
)
from gpufleet_contracts.keys import AttachKey, KeyList, KeyView, ListKeys, RemoveKey
from gpufleet_contracts.localdata import (
    CompleteLocalUpload,
    ConnectJob,
    LocalConnection,
    LocalDataSent,
    LocalMountView,
    LocalStage,
    RelayedView,
    StageLocalData,
)
from gpufleet_contracts.nodes import NodeRegistered, NodeStateChanged
from gpufleet_contracts.platform import (
    CompletePlatformUpload,
    PlatformGrant,
    PlatformObjectView,
    StagePlatformObject,
)
from gpufleet_contracts.projects import (
    AddProjectMember,
    CreateProject,
    ListProjects,
    ProjectList,
    ProjectView,
    RemoveProjectMember,
)
from gpufleet_contracts.serving import (
    CreateEndpointKey,
    EndpointKeyCreated,
    EndpointKeyList,
    EndpointKeyVerdict,
    EndpointKeyView,
    EndpointMetered,
    EndpointReady,
    ListEndpointKeys,
    NotebookAccess,
    OpenNotebook,
    RevokeEndpointKey,
    VerifyEndpointKey,
)
from gpufleet_contracts.verification import NodeVerified
from gpufleet_telemetry.exposition import Source
from nats.js import JetStreamContext
from pymongo import ASCENDING, IndexModel

from . import endpointkeys, keystore, projects
from .devicecheckpoints import DeviceCheckpointGrants
from .devicekeys import DeviceKeyGrants
from .endpointkeys import EndpointKeys
from .leadership import Lease
from .localdata import LocalRelay
from .metrics import SchedulerMetrics
from .notebooks import Notebooks
from .platform import PlatformStaging
from .reports import REPORTS_BATCH, REPORTS_LINGER_S, Report
from .scheduler import Scheduler
from .settings import SchedulerSettings

SERVICE = "scheduler"
# Submissions in progress at once: each waits for its batch's transaction and the next
# placement pass, so the batches (and the throughput) grow with this (benchmarks/scheduler).
SUBMIT_CONCURRENCY = 4096

INDEXES = {
    "jobs": [
        IndexModel([("state", ASCENDING), ("queued_at", ASCENDING)]),
        IndexModel([("owner", ASCENDING), ("queued_at", ASCENDING)]),
        IndexModel([("creator", ASCENDING), ("queued_at", ASCENDING)]),  # federated jobs
        IndexModel([("rev", ASCENDING)]),  # what changed after a checkpoint
    ],
    "nodes": [
        IndexModel([("minion_id", ASCENDING)], unique=True),
        IndexModel([("rev", ASCENDING)]),
    ],
    "claims": [
        IndexModel([("placement_id", ASCENDING)]),
        IndexModel([("node_id", ASCENDING)]),
    ],
    **projects.INDEXES,
    **keystore.INDEXES,
    **endpointkeys.INDEXES,
}


class Handlers:
    """The subjects' handlers: decode, call the scheduler, reply. Requests act for the
    account of their subject (R-TEN-2)."""

    def __init__(
        self,
        sched: Scheduler,
        broker: NatsBroker,
        source: str,
        platform: PlatformStaging,
        local: LocalRelay,
        endpoint_keys: EndpointKeys,
        notebooks: Notebooks,
        device_keys: DeviceKeyGrants,
        device_checkpoints: DeviceCheckpointGrants,
    ) -> None:
        self.sched = sched
        self.broker = broker
        self.source = source
        self.platform = platform
        self.local = local
        self.endpoint_keys = endpoint_keys
        self.notebooks = notebooks
        self.device_keys = device_keys
        self.device_checkpoints = device_checkpoints

    # --- requests (core NATS, an account's) ---

    async def submit_job(self, body: SubmitJob, account: str) -> JobAccepted:
        """Validate and queue a job; replies its id, its state and why it waits."""
        job = await self.sched.admission.submit(body.spec, account, request_id=body.request_id)
        return JobAccepted.model_validate(job)

    async def get_job(self, body: GetJob, account: str) -> JobView:
        """A job, its state and why it waits."""
        return JobView.model_validate(await self.sched.queries.get(body.job_id, account))

    async def list_jobs(self, body: ListJobs, account: str) -> JobList:
        return JobList.model_validate({"jobs": await self.sched.queries.list(account, body.limit)})

    # --- operators' requests (core NATS, the admin subject: operator credentials only) ---

    async def list_all_jobs(self, body: ListAllJobs) -> JobList:
        jobs = await self.sched.queries.list_all(body.limit, body.account, body.state)
        return JobList.model_validate({"jobs": jobs})

    async def cancel_job(self, body: CancelJob, account: str) -> JobView:
        """Cancel a job (its project's owner or its creator)."""
        return JobView.model_validate(await self.sched.lifecycle.cancel(body.job_id, account))

    async def job_logs(self, body: GetJobLogs, account: str) -> JobLogs:
        logs = self.sched.queries.logs
        return JobLogs.model_validate(
            await logs(body.job_id, account, body.after, body.limit, body.cursor)
        )

    # --- `local` data (`job connect`): the job's own account only ---

    async def connect_job(self, body: ConnectJob, account: str) -> LocalConnection:
        return await self.local.connect(body, account)

    async def local_data_sent(self, body: LocalDataSent, account: str) -> LocalMountView:
        return await self.local.sent(body, account)

    # --- projects (R-TEN-1) ---

    async def create_project(self, body: CreateProject, account: str) -> ProjectView:
        return ProjectView.model_validate(await self.sched.projects.create(account, body.name))

    async def add_project_member(self, body: AddProjectMember, account: str) -> ProjectView:
        return ProjectView.model_validate(
            await self.sched.projects.add_member(account, body.project, body.account)
        )

    async def remove_project_member(self, body: RemoveProjectMember, account: str) -> ProjectView:
        view = await self.sched.projects.remove_member(account, body.project, body.account)
        return ProjectView.model_validate(view)

    async def list_projects(self, body: ListProjects, account: str) -> ProjectList:
        return ProjectList.model_validate(
            {"projects": await self.sched.projects.list(account, body.limit)}
        )

    # --- attached third-party keys (R-JOB-7): the acting account's own, never a value ---

    async def attach_key(self, body: AttachKey, account: str) -> KeyView:
        return KeyView.model_validate(await self.sched.keys.attach(account, body))

    async def list_keys(self, body: ListKeys, account: str) -> KeyList:
        return KeyList.model_validate({"keys": await self.sched.keys.list(account)})

    async def remove_key(self, body: RemoveKey, account: str) -> KeyView:
        return KeyView.model_validate(await self.sched.keys.remove(account, body.type))

    # --- endpoints' API keys (R-JOB-6): the acting account's endpoints only ---

    async def create_endpoint_key(
        self, body: CreateEndpointKey, account: str
    ) -> EndpointKeyCreated:
        return await self.endpoint_keys.create(body, account)

    async def list_endpoint_keys(self, body: ListEndpointKeys, account: str) -> EndpointKeyList:
        return await self.endpoint_keys.list(body, account)

    async def revoke_endpoint_key(self, body: RevokeEndpointKey, account: str) -> EndpointKeyView:
        return await self.endpoint_keys.revoke(body, account)

    # --- notebooks (R-JOB-1): their creator's only ---

    async def open_notebook(self, body: OpenNotebook, account: str) -> NotebookAccess:
        return await self.notebooks.open(body, account)

    # --- a node's requests (nrpc.scheduler.<verb>.<minion_id>: that node's only) ---

    async def verify_endpoint_key(
        self, body: VerifyEndpointKey, subject: str
    ) -> EndpointKeyVerdict:
        """Whether a key opens an endpoint one of whose workers the asking node holds."""
        return await self.endpoint_keys.verify(body, subjects.node_rpc_node(subject) or "")

    async def stage_platform_object(self, body: StagePlatformObject, subject: str) -> PlatformGrant:
        """A presigned URL of a platform object one of the asking node's placements uses."""
        return await self.platform.stage(body, subjects.node_rpc_node(subject) or "")

    async def complete_platform_upload(
        self, body: CompletePlatformUpload, subject: str
    ) -> PlatformObjectView:
        """The asking node put its placement's platform output: the datastore checks it."""
        return await self.platform.complete(body, subjects.node_rpc_node(subject) or "")

    async def stage_local_data(self, body: StageLocalData, subject: str) -> LocalStage:
        """A presigned URL of a placement's relayed `local` data, or `waiting` for the user."""
        return await self.local.stage(body, subjects.node_rpc_node(subject) or "")

    async def complete_local_upload(self, body: CompleteLocalUpload, subject: str) -> RelayedView:
        """The asking node put its placement's `local` output: the datastore checks it."""
        return await self.local.complete(body, subjects.node_rpc_node(subject) or "")

    async def device_keys_of(self, body: GetDeviceKeys, subject: str) -> DeviceKeys:
        """The asking device's configuration's attached keys, sealed to the key it sent."""
        return await self.device_keys.give(body, subjects.node_rpc_node(subject) or "")

    async def stage_device_checkpoint(
        self, body: StageDeviceCheckpoint, subject: str
    ) -> PlatformGrant:
        """A presigned URL of a checkpoint the asking device's configuration names."""
        return await self.device_checkpoints.give(body, subjects.node_rpc_node(subject) or "")

    # --- events (JetStream, durable) ---

    async def on_account_changed(self, body: AccountChanged) -> None:
        """The provisioner owns accounts; the scheduler keeps their plans (R-TEN-3)."""
        await self.sched.projects.account_changed(body)

    async def on_account_removed(self, body: AccountRemoved) -> None:
        """The provisioner removed an account: no job is admitted for it any more, and its
        open jobs are cancelled (their workers stopped) with the reason "account removed"."""
        await self.sched.projects.account_removed(body)
        await self.sched.lifecycle.account_removed(body.account)

    async def on_node_registered(self, body: NodeRegistered) -> None:
        await self.sched.lifecycle.node_changed(body)

    async def on_node_state_changed(self, body: NodeStateChanged) -> None:
        await self.sched.lifecycle.node_changed(body)

    async def on_node_verified(self, body: NodeVerified) -> None:
        """Whether a node's hardware passed its GPU check: only then another account's jobs."""
        await self.sched.lifecycle.node_verified(body)

    async def on_enqueue_job(self, body: EnqueueJob, delivery: Delivery) -> None:
        """Another system's submission; invalid bodies never get here (dead-lettered).
        gpufleet.v1.cmd.scheduler.<account>.enqueue_job: only that account may publish it."""
        account = subjects.token_at(delivery.subject, 4) or ""
        rejected = await self.sched.enqueue(body, account)
        if rejected is not None:
            msg_id = f"rejected:{account}:{body.request_id}"
            await publish(self.broker, rejected, source=self.source, msg_id=msg_id)

    async def on_worker_reports(self, batch: list[tuple[Message, Delivery]]) -> None:
        """Workers started and finished, as their nodes report them, a batch at a time in
        stream order; each counts only on the subject of the node its body names and when
        that node is the placement's (reports.py)."""
        await self.sched.reports.reported([(m, d) for m, d in batch if isinstance(m, Report)])

    async def on_sync(self, body: SchedulerSync) -> None:
        """Another instance changed these jobs and nodes: the leader reads them again."""
        await self.sched.sync(body)


def build_app(ports: Ports, settings: SchedulerSettings | None = None) -> Service[Scheduler]:
    settings = settings or SchedulerSettings()
    broker, store = ports.broker, ports.db
    # Published outbox rows are deleted at once: at the scheduler's rate, kept rows slow
    # every poll on nx-27017 (gpufleet_bus.outbox).
    rt = ServiceRuntime(SERVICE, ports, indexes=INDEXES, outbox_keep=timedelta(0))
    lease = Lease(store.db, ttl_ms=int(settings.lease_ttl_s * 1000), owner=settings.instance)

    async def notify(jobs: list[str], nodes: list[str]) -> None:
        note = SchedulerSync(jobs=jobs, nodes=nodes)
        await broker.publish(note.model_dump_json().encode(), subjects.SCHEDULER_SYNC)

    async def jetstream() -> JetStreamContext:
        return (await broker.connect()).jetstream()

    sched = Scheduler(
        store,
        ports.clock,
        lease=lease,
        settings=settings,
        notify=notify,
        jetstream=jetstream,
        inbox_prefix=rt.inbox_prefix,
    )
    platform = PlatformStaging(sched.state, Asker(broker))
    local = LocalRelay(sched.state, Asker(broker), platform.held)
    on = Handlers(
        sched,
        broker,
        rt.source,
        platform,
        local,
        EndpointKeys(sched.state),
        Notebooks(sched.state),
        DeviceKeyGrants(sched.state, Asker(broker)),
        DeviceCheckpointGrants(Asker(broker)),
    )

    rt.wire(
        requests={
            # Submissions wait for their batch's transaction and placement pass: one at a
            # time would make every request pay a whole transaction (benchmarks/scheduler).
            "submit_job": Request(on.submit_job, concurrency=SUBMIT_CONCURRENCY),
            "get_job": on.get_job,
            "list_jobs": on.list_jobs,
            "cancel_job": on.cancel_job,
            "job_logs": Request(on.job_logs, description=GetJobLogs.__doc__),
            "create_project": Request(on.create_project, description=CreateProject.__doc__),
            "add_project_member": Request(
                on.add_project_member, description=AddProjectMember.__doc__
            ),
            "remove_project_member": Request(
                on.remove_project_member, description=RemoveProjectMember.__doc__
            ),
            "list_projects": Request(on.list_projects, description=ListProjects.__doc__),
            "attach_key": Request(on.attach_key, description=AttachKey.__doc__),
            "list_keys": Request(on.list_keys, description=ListKeys.__doc__),
            "remove_key": Request(on.remove_key, description=RemoveKey.__doc__),
            "create_endpoint_key": Request(
                on.create_endpoint_key, description=CreateEndpointKey.__doc__
            ),
            "list_endpoint_keys": Request(
                on.list_endpoint_keys, description=ListEndpointKeys.__doc__
            ),
            "revoke_endpoint_key": Request(
                on.revoke_endpoint_key, description=RevokeEndpointKey.__doc__
            ),
            "open_notebook": Request(on.open_notebook, description=OpenNotebook.__doc__),
            "connect_job": Request(on.connect_job, description=ConnectJob.__doc__),
            "local_data_sent": Request(on.local_data_sent, description=LocalDataSent.__doc__),
        },
        admin={
            "list_all_jobs": Request(on.list_all_jobs, description=ListAllJobs.__doc__),
        },
        direct={
            subjects.as_node(VerifyEndpointKey.SUBJECT, "*"): Request(
                on.verify_endpoint_key, description=VerifyEndpointKey.__doc__
            ),
            subjects.as_node(StagePlatformObject.SUBJECT, "*"): Request(
                on.stage_platform_object, description=StagePlatformObject.__doc__
            ),
            subjects.as_node(CompletePlatformUpload.SUBJECT, "*"): Request(
                on.complete_platform_upload, description=CompletePlatformUpload.__doc__
            ),
            subjects.as_node(StageLocalData.SUBJECT, "*"): Request(
                on.stage_local_data, description=StageLocalData.__doc__
            ),
            subjects.as_node(CompleteLocalUpload.SUBJECT, "*"): Request(
                on.complete_local_upload, description=CompleteLocalUpload.__doc__
            ),
            subjects.as_node(GetDeviceKeys.SUBJECT, "*"): Request(
                on.device_keys_of, description=GetDeviceKeys.__doc__
            ),
            subjects.as_node(StageDeviceCheckpoint.SUBJECT, "*"): Request(
                on.stage_device_checkpoint, description=StageDeviceCheckpoint.__doc__
            ),
        },
        events={
            "account-changed": on.on_account_changed,
            "account-removed": on.on_account_removed,
            "node-registered": on.on_node_registered,
            "node-state-changed": on.on_node_state_changed,
            "node-verified": on.on_node_verified,
            "enqueue-job": on.on_enqueue_job,
            # One consumer of what nodes report of their workers (stream REPORTS), in order:
            # a start is seen before its finish; applied a batch (one transaction) at a time.
            "worker-events": Batched(
                [
                    WorkerStarted,
                    WorkerUploading,
                    WorkerStaging,
                    WorkerFinished,
                    EndpointReady,
                    EndpointMetered,
                ],
                on.on_worker_reports,
                subject=subjects.WORKER_REPORTS,
                max_batch=REPORTS_BATCH,
                linger_s=REPORTS_LINGER_S,
            ),
        },
        signals={subjects.SCHEDULER_SYNC: on.on_sync},
        metrics=[Source("queue", SchedulerMetrics(sched).collect)],
        every=[
            # Renew the lease through a pass; a newly elected leader rebuilds its memory.
            Every(settings.lease_ttl_s / 3, sched.renew, "scheduler-lease", at_start=False),
            Every(settings.checkpoint_s, sched.checkpoint, "scheduler-checkpoint", at_start=False),
        ],
        publishes=[
            JobQueued,
            JobRejected,
            JobStateChanged,
            WorkerPlaced,
            # the reports it took, stated on the node's `kept` subject (reports.py); a lost
            # node's workers' ends (lifecycle.py)
            (WorkerStarted, subjects.kept("started", "{minion_id}")),
            (WorkerUploading, subjects.kept("uploading", "{minion_id}")),
            (WorkerFinished, subjects.kept("finished", "{minion_id}")),
            StartWorker,
            StopWorker,
            PendingDemandChanged,
        ],
        startup=[sched.start],
        shutdown=[sched.stop],
    )
    return rt.built(sched)
