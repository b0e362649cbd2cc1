"""Composition root of the scheduler: ports in, FastStream app out, every subject wired here."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar

from faststream import FastStream
from faststream.middlewares import AckPolicy
from faststream.nats import NatsBroker, NatsMessage
from gpufleet_bus import (
    ServiceRuntime,
    account_of,
    account_subject,
    on_its_own_subject,
    publish,
    received_at,
)
from gpufleet_contracts import error, subjects
from gpufleet_contracts.identity import AccountChanged
from gpufleet_contracts.jobs import (
    CancelJob,
    EnqueueJob,
    GetJob,
    GetJobLogs,
    JobQueued,
    JobRejected,
    JobStateChanged,
    ListJobs,
    PendingDemandChanged,
    StartWorker,
    StopWorker,
    SubmitJob,
    WorkerFinished,
    WorkerPlaced,
    WorkerStarted,
)
from gpufleet_contracts.nodes import NodeRegistered, NodeStateChanged
from gpufleet_contracts.projects import (
    AddProjectMember,
    CreateProject,
    ListProjects,
    RemoveProjectMember,
)
from gpufleet_store import Store, utcnow

from .errors import NotFound, Refused
from .leadership import Lease
from .logs import read_logs
from .service import INDEXES, Scheduler, SchedulerSettings

SERVICE = "scheduler"
F = TypeVar("F", bound=Callable[..., Awaitable[Any]])
SUBMIT_WORKERS = 256
# Submissions in progress at once: each waits for its batch's transaction and the next
# placement pass, so the batches (and the throughput) grow with this (benchmarks/scheduler).
SUBMIT_CONCURRENCY = 4096
# Core NATS, every instance: "these jobs/nodes changed" from an instance that does not lead.
SYNC_SUBJECT = subjects.internal(SERVICE, "sync")


def settings_from_env() -> SchedulerSettings:
    return SchedulerSettings(
        starve_after_s=float(os.environ.get("GPUFLEET_STARVE_AFTER_S", "300")),
        resync_s=float(os.environ.get("GPUFLEET_SCHEDULER_RESYNC_S", "30")),
        checkpoint_s=float(os.environ.get("GPUFLEET_SCHEDULER_CHECKPOINT_S", "60")),
        secret_key=os.environ.get("GPUFLEET_SECRET_KEY") or None,
    )


def build_app(
    store: Store,
    broker: NatsBroker,
    clock: Callable[[], datetime] = utcnow,
    *,
    settings: SchedulerSettings | None = None,
    lease: Lease | None = None,
) -> tuple[FastStream, Scheduler]:
    # Published outbox rows are deleted at once: at the scheduler's rate, kept rows slow
    # every poll on nx-27017 (gpufleet_bus.outbox).
    rt = ServiceRuntime(SERVICE, broker, store, indexes=INDEXES, outbox_keep=timedelta(0))
    ttl_ms = int(float(os.environ.get("GPUFLEET_LEASE_TTL_S", "10")) * 1000)
    # A name stable across restarts (the host's: a container's survives its restarts) lets a
    # restarted leader take its lease back at once (leadership.py).
    owner = os.environ.get("GPUFLEET_SCHEDULER_INSTANCE") or socket.gethostname()
    lease = lease or Lease(store.db, ttl_ms=ttl_ms, owner=owner)

    async def notify(jobs: list[str], nodes: list[str]) -> None:
        await broker.publish(json.dumps({"jobs": jobs, "nodes": nodes}).encode(), SYNC_SUBJECT)

    sched = Scheduler(
        store, clock, lease=lease, settings=settings or settings_from_env(), notify=notify
    )
    rt.publishes(
        JobQueued,
        JobRejected,
        JobStateChanged,
        WorkerPlaced,
        WorkerFinished,
        StartWorker,
        StopWorker,
        PendingDemandChanged,
    )

    async def guarded(fn: Any) -> dict[str, Any]:
        try:
            result: dict[str, Any] = await fn()
            return result
        except NotFound as exc:
            return error("not_found", str(exc)).model_dump(mode="json")
        except Refused as exc:
            return exc.reply.model_dump(mode="json")

    def concurrent_request(verb: str, description: str) -> Callable[[F], F]:
        """Like `rt.on_request`, handling up to SUBMIT_WORKERS requests at once: submissions
        wait for their batch's transaction and placement pass, so one at a time would make
        every request pay a whole transaction (see benchmarks/scheduler)."""
        sub = broker.subscriber(
            account_subject(SERVICE, verb),
            queue=f"{SERVICE}-rpc",
            ack_policy=AckPolicy.MANUAL,
            max_workers=SUBMIT_WORKERS,
            title=f"{SERVICE}:{verb}",
            description=description,
        )

        def register(fn: F) -> F:
            sub(fn)
            return fn

        return register

    # --- requests (core NATS) ---
    @rt.on_fast_request(
        "submit_job",
        SubmitJob,
        description="Validate and queue a job; replies {id, state}.",
        concurrency=SUBMIT_CONCURRENCY,
    )
    async def submit_job(body: SubmitJob, account: str) -> dict[str, Any]:
        """Served on the raw connection (gpufleet_bus.fastpath): the fleet's hottest subject."""

        async def run() -> dict[str, Any]:
            job = await sched.submit(body.spec, account)
            return {
                "id": job["id"],
                "state": job["state"],
                "queue_reason": job["queue_reason"],
                "queue_detail": job["queue_detail"],
            }

        return await guarded(run)

    @concurrent_request("get_job", "A job, its state and why it waits.")
    async def get_job(body: GetJob, msg: NatsMessage) -> dict[str, Any]:
        return await guarded(lambda: sched.get(body.job_id, account_of(msg)))

    @rt.on_request("job_logs", description=GetJobLogs.__doc__)
    async def job_logs(body: GetJobLogs, msg: NatsMessage) -> dict[str, Any]:
        async def run() -> dict[str, Any]:
            job = await sched.document(body.job_id, account_of(msg))
            js = (await broker.connect()).jetstream()
            return await read_logs(js, job, body.after, body.limit, rt.inbox_prefix)

        return await guarded(run)

    @rt.on_request("list_jobs")
    async def list_jobs(body: ListJobs, msg: NatsMessage) -> dict[str, Any]:
        return {"jobs": await sched.list(account_of(msg), body.limit)}

    @rt.on_request("cancel_job", description="Cancel a job (its project's owner or its creator).")
    async def cancel_job(body: CancelJob, msg: NatsMessage) -> dict[str, Any]:
        return await guarded(lambda: sched.cancel(body.job_id, account_of(msg)))

    # --- projects (R-TEN-1) ---
    @rt.on_request("create_project", description=CreateProject.__doc__)
    async def create_project(body: CreateProject, msg: NatsMessage) -> dict[str, Any]:
        return await guarded(lambda: sched.projects.create(account_of(msg), body.name))

    @rt.on_request("add_project_member", description=AddProjectMember.__doc__)
    async def add_project_member(body: AddProjectMember, msg: NatsMessage) -> dict[str, Any]:
        return await guarded(
            lambda: sched.projects.add_member(account_of(msg), body.project, body.account)
        )

    @rt.on_request("remove_project_member", description=RemoveProjectMember.__doc__)
    async def remove_project_member(body: RemoveProjectMember, msg: NatsMessage) -> dict[str, Any]:
        return await guarded(
            lambda: sched.projects.remove_member(account_of(msg), body.project, body.account)
        )

    @rt.on_request("list_projects", description=ListProjects.__doc__)
    async def list_projects(body: ListProjects, msg: NatsMessage) -> dict[str, Any]:
        return {"projects": await sched.projects.list(account_of(msg), body.limit)}

    # --- events (JetStream, durable) ---
    @rt.on_event(AccountChanged, "account-changed")
    async def on_account_changed(body: AccountChanged) -> None:
        """The provisioner owns accounts; the scheduler keeps their plans (R-TEN-3)."""
        await sched.projects.account_changed(body)

    @rt.on_event(NodeRegistered, "node-registered")
    async def on_node_registered(body: NodeRegistered) -> None:
        await sched.node_changed(body)

    @rt.on_event(NodeStateChanged, "node-state-changed")
    async def on_node_state_changed(body: NodeStateChanged) -> None:
        await sched.node_changed(body)

    @rt.on_event(EnqueueJob, "enqueue-job")
    async def on_enqueue_job(body: EnqueueJob, msg: NatsMessage) -> None:
        """Another system's submission; invalid bodies never get here (dead-lettered)."""
        # gpufleet.v1.cmd.scheduler.<account>.enqueue_job: only that account may publish it
        account = subjects.token_at(msg.raw_message.subject, 4) or ""
        try:
            await sched.submit(body.spec, account, wait=False, request_id=body.request_id)
        except Refused as exc:
            rejected = JobRejected(
                request_id=body.request_id, account=account, error=exc.reply.error, at=clock()
            )
            await publish(
                broker, rejected, source=rt.source, msg_id=f"rejected:{account}:{body.request_id}"
            )
            return

    # A worker fact counts only on the subject of the node its body names (the only one
    # that node may publish); the scheduler then checks that node is the placement's.
    @rt.on_event(WorkerStarted, "worker-started")
    async def on_worker_started(body: WorkerStarted, msg: NatsMessage) -> None:
        if on_its_own_subject(msg, body.minion_id):
            await sched.worker_started(body, received_at(msg) or clock())

    @rt.on_event(WorkerFinished, "worker-finished")
    async def on_worker_finished(body: WorkerFinished, msg: NatsMessage) -> None:
        if on_its_own_subject(msg, body.minion_id):
            await sched.worker_finished(body, received_at(msg) or clock())

    @broker.subscriber(SYNC_SUBJECT, title="scheduler:sync", no_reply=True)
    async def on_sync(body: dict[str, Any]) -> None:
        await sched.sync(list(body.get("jobs") or []), list(body.get("nodes") or []))

    tasks: list[asyncio.Task[None]] = []

    async def keep_leading() -> None:
        """Renew the lease; a newly elected leader rebuilds its memory and runs the queue;
        the leader writes a checkpoint now and then (checkpoint.py)."""
        loop = asyncio.get_running_loop()
        last_checkpoint = loop.time()
        while True:
            await asyncio.sleep(lease.ttl_ms / 3000)
            with contextlib.suppress(Exception):
                await sched.request_pass()
            if loop.time() - last_checkpoint > sched.settings.checkpoint_s:
                last_checkpoint = loop.time()
                sched.checkpoint_soon()

    async def first_pass() -> None:
        await sched.schedule()  # jobs that were queued while the scheduler was down
        tasks.append(asyncio.create_task(keep_leading()))

    async def stop() -> None:
        for t in tasks:
            t.cancel()
        if sched.loaded:  # the next leader starts from here, not from every document
            try:
                await sched.write_checkpoint()
            except Exception:
                logging.getLogger("gpufleet.scheduler").exception("checkpoint at stop failed")
        with contextlib.suppress(Exception):
            await lease.release()

    rt.app.after_startup(first_pass)
    rt.app.on_shutdown(stop)
    return rt.app, sched
