"""Composition root of billing; every subject it handles is wired here."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from faststream import FastStream
from faststream.nats import NatsBroker, NatsMessage
from gpufleet_bus import ServiceRuntime, account_of, on_its_own_subject, received_at
from gpufleet_contracts.billing import (
    DeviceFeeCharged,
    EarningCredited,
    FederatedFeeCharged,
    PayoutMade,
    UsageCharged,
)
from gpufleet_contracts.devices import DeviceAdded, DeviceRemoved
from gpufleet_contracts.fields import Int
from gpufleet_contracts.jobs import WorkerFinished, WorkerPlaced, WorkerStarted
from gpufleet_contracts.providers import ProviderEnabled
from gpufleet_store import Store, utcnow
from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from .periods import Clock
from .queries import Queries, parse_time
from .service import INDEXES, Billing

SERVICE = "billing"
STOP_GRACE_S = 10.0
log = logging.getLogger("gpufleet.billing")


class BillingSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPUFLEET_BILLING_", extra="ignore")
    tick_s: float = 30.0  # how often the clock settles what time made due


class Range(BaseModel):
    from_: str | None = Field(default=None, alias="from", description="ISO date or date-time")
    to: str | None = Field(default=None, description="ISO date or date-time (exclusive)")


class EntriesQuery(Range):
    limit: Int = Field(default=50, ge=1, le=1000)


class JobCostQuery(BaseModel):
    job_id: str


def build_app(
    store: Store,
    broker: NatsBroker,
    clock: Clock = utcnow,
    tick_s: float | None = None,
) -> tuple[FastStream, Billing]:
    rt = ServiceRuntime(SERVICE, broker, store, indexes=INDEXES)
    billing = Billing(store, clock)
    queries = Queries(store.db)
    period = tick_s if tick_s is not None else BillingSettings().tick_s
    rt.publishes(UsageCharged, EarningCredited, FederatedFeeCharged, DeviceFeeCharged, PayoutMade)

    @rt.on_event(WorkerPlaced, "worker-placed")
    async def on_worker_placed(body: WorkerPlaced) -> None:
        await billing.worker_placed(body)

    # A worker fact counts only on the subject of the node its body names (the only one
    # that node may publish); billing then checks that node is the placement's.
    @rt.on_event(WorkerStarted, "worker-started")
    async def on_worker_started(body: WorkerStarted, msg: NatsMessage) -> None:
        if on_its_own_subject(msg, body.minion_id):
            await billing.worker_started(body, received_at(msg) or clock())

    @rt.on_event(WorkerFinished, "worker-finished")
    async def on_worker_finished(body: WorkerFinished, msg: NatsMessage) -> None:
        if on_its_own_subject(msg, body.minion_id):
            await billing.worker_finished(body, received_at(msg) or clock())

    @rt.on_event(DeviceAdded, "device-added")
    async def on_device_added(body: DeviceAdded) -> None:
        await billing.device_added(body)

    @rt.on_event(DeviceRemoved, "device-removed")
    async def on_device_removed(body: DeviceRemoved) -> None:
        await billing.device_removed(body)

    @rt.on_event(ProviderEnabled, "provider-enabled")
    async def on_provider_enabled(body: ProviderEnabled) -> None:
        await billing.provider_enabled(body)

    @rt.on_request("balance", description="The acting account's balance and unpaid earnings.")
    async def balance(msg: NatsMessage) -> dict[str, Any]:
        return await queries.balance(account_of(msg))

    @rt.on_request("entries", description="The acting account's ledger entries, newest first.")
    async def entries(body: EntriesQuery, msg: NatsMessage) -> dict[str, Any]:
        found = await queries.entries(
            account_of(msg), body.limit, parse_time(body.from_), parse_time(body.to)
        )
        return {"entries": found}

    @rt.on_request("job_cost", description="What one job cost the acting account, by kind.")
    async def job_cost(body: JobCostQuery, msg: NatsMessage) -> dict[str, Any]:
        return await queries.job_cost(body.job_id, account_of(msg))

    @rt.on_request("earnings", description="The acting account's earnings per node and region.")
    async def earnings(body: Range, msg: NatsMessage) -> dict[str, Any]:
        return await queries.earnings(account_of(msg), parse_time(body.from_), parse_time(body.to))

    ticker: list[asyncio.Task[None]] = []
    wake = asyncio.Event()  # set on shutdown, so the clock does not sleep out its period

    async def run_clock() -> None:
        while not billing.stopping:
            try:
                await billing.tick()
            except Exception:  # the next tick retries; every settlement is idempotent
                log.exception("billing tick failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout=period)

    async def start_clock() -> None:
        if period > 0:
            ticker.append(asyncio.create_task(run_clock(), name="billing-clock"))

    async def stop_clock() -> None:
        """Let the clock finish the settlement in hand (it stops between settlements), and
        cancel it only if that takes too long."""
        billing.stopping = True
        wake.set()
        while ticker:
            task = ticker.pop()
            try:
                await asyncio.wait_for(asyncio.shield(task), timeout=STOP_GRACE_S)
            except TimeoutError:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    rt.app.after_startup(start_clock)
    rt.app.on_shutdown(stop_clock)
    return rt.app, billing
