"""Composition root of billing; every subject it handles is wired here."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from faststream import FastStream
from faststream.nats import NatsBroker, NatsMessage
from gpufleet_bus import ServiceRuntime, account_of
from gpufleet_contracts.billing import UsageCharged
from gpufleet_contracts.jobs import WorkerFinished, WorkerPlaced
from gpufleet_store import Store, utcnow
from pydantic import BaseModel, Field

from .service import INDEXES, Billing

SERVICE = "billing"


class EntriesQuery(BaseModel):
    limit: int = Field(default=50, ge=1, le=1000)


class JobCostQuery(BaseModel):
    job_id: str


def build_app(
    store: Store, broker: NatsBroker, clock: Callable[[], datetime] = utcnow
) -> tuple[FastStream, Billing]:
    rt = ServiceRuntime(SERVICE, broker, store, indexes=INDEXES)
    billing = Billing(store, clock)
    rt.publishes(UsageCharged)

    @rt.on_event(WorkerPlaced, "worker-placed")
    async def on_worker_placed(body: WorkerPlaced) -> None:
        await billing.worker_placed(body)

    @rt.on_event(WorkerFinished, "worker-finished")
    async def on_worker_finished(body: WorkerFinished) -> None:
        await billing.worker_finished(body)

    @rt.on_request("balance", description="The acting account's balance.")
    async def balance(msg: NatsMessage) -> dict[str, Any]:
        return await billing.balance(account_of(msg.headers))

    @rt.on_request("entries", description="The acting account's latest ledger entries.")
    async def entries(body: EntriesQuery, msg: NatsMessage) -> dict[str, Any]:
        return {"entries": await billing.entries(account_of(msg.headers), body.limit)}

    @rt.on_request("job_cost", description="What one job cost the acting account.")
    async def job_cost(body: JobCostQuery, msg: NatsMessage) -> dict[str, Any]:
        return await billing.job_cost(body.job_id, account_of(msg.headers))

    return rt.app, billing
