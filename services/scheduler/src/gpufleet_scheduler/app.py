"""Composition root of the scheduler: ports in, FastStream app out, every subject wired here."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from faststream import FastStream
from faststream.nats import NatsBroker, NatsMessage
from gpufleet_bus import ServiceRuntime, account_of
from gpufleet_contracts import error
from gpufleet_contracts.jobs import (
    CancelJob,
    GetJob,
    JobQueued,
    JobStateChanged,
    ListJobs,
    StartWorker,
    StopWorker,
    SubmitJob,
    WorkerFinished,
    WorkerPlaced,
    WorkerStarted,
)
from gpufleet_contracts.nodes import NodeRegistered, NodeStateChanged
from gpufleet_store import Store, utcnow

from .service import INDEXES, NotFound, Scheduler

SERVICE = "scheduler"


def build_app(
    store: Store, broker: NatsBroker, clock: Callable[[], datetime] = utcnow
) -> tuple[FastStream, Scheduler]:
    rt = ServiceRuntime(SERVICE, broker, store, indexes=INDEXES)
    sched = Scheduler(store, clock)
    rt.publishes(JobQueued, JobStateChanged, WorkerPlaced, StartWorker, StopWorker)

    async def guarded(fn: Any) -> dict[str, Any]:
        try:
            result: dict[str, Any] = await fn()
            return result
        except NotFound as exc:
            return error("not_found", str(exc)).model_dump(mode="json")

    # --- requests (core NATS) ---
    @rt.on_request("submit_job", description="Validate and queue a job; replies {id, state}.")
    async def submit_job(body: SubmitJob, msg: NatsMessage) -> dict[str, Any]:
        job = await sched.submit(body.spec, account_of(msg.headers))
        return {"id": job["id"], "state": job["state"], "queue_reason": job["queue_reason"]}

    @rt.on_request("get_job")
    async def get_job(body: GetJob, msg: NatsMessage) -> dict[str, Any]:
        return await guarded(lambda: sched.get(body.job_id, account_of(msg.headers)))

    @rt.on_request("list_jobs")
    async def list_jobs(body: ListJobs, msg: NatsMessage) -> dict[str, Any]:
        return {"jobs": await sched.list(account_of(msg.headers), body.limit)}

    @rt.on_request("cancel_job")
    async def cancel_job(body: CancelJob, msg: NatsMessage) -> dict[str, Any]:
        return await guarded(lambda: sched.cancel(body.job_id, account_of(msg.headers)))

    # --- events (JetStream, durable) ---
    @rt.on_event(NodeRegistered, "node-registered")
    async def on_node_registered(body: NodeRegistered) -> None:
        await sched.node_changed(body)

    @rt.on_event(NodeStateChanged, "node-state-changed")
    async def on_node_state_changed(body: NodeStateChanged) -> None:
        await sched.node_changed(body)

    @rt.on_event(WorkerStarted, "worker-started")
    async def on_worker_started(body: WorkerStarted) -> None:
        await sched.worker_started(body)

    @rt.on_event(WorkerFinished, "worker-finished")
    async def on_worker_finished(body: WorkerFinished) -> None:
        await sched.worker_finished(body)

    async def first_pass() -> None:
        await sched.schedule()  # jobs that were queued while the scheduler was down

    rt.app.after_startup(first_pass)
    return rt.app, sched
