"""Composition root of billing: its ports in, its Service out; every subject it handles is
in the one wiring table below."""

from __future__ import annotations

from functools import partial

from gpufleet_bus import Batched, Delivery, Every, Ports, Service, ServiceRuntime
from gpufleet_bus.accounts import on_its_own_subject
from gpufleet_contracts import Message, subjects
from gpufleet_contracts.billing import (
    Balance,
    DeviceFeeCharged,
    EarningCredited,
    Earnings,
    EarningsQuery,
    Entries,
    EntriesQuery,
    FederatedFeeCharged,
    GetBalance,
    JobCost,
    JobCostQuery,
    LedgerSeries,
    LedgerSeriesQuery,
    PayoutMade,
    UsageCharged,
)
from gpufleet_contracts.devices import DeviceAdded, DeviceRemoved
from gpufleet_contracts.jobs import (
    WorkerFinished,
    WorkerPlaced,
    WorkerStarted,
    WorkerUploading,
)
from gpufleet_telemetry.exposition import Source
from pydantic_settings import BaseSettings, SettingsConfigDict

from . import running_totals
from .metrics import BillingMetrics
from .queries import Queries, parse_time
from .service import INDEXES, Billing

SERVICE = "billing"
STOP_GRACE_S = 10.0  # the clock's settlement in hand may finish within this at shutdown


class BillingSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPUFLEET_BILLING_", extra="ignore")
    tick_s: float = 30.0  # how often the clock settles what time made due


class Handlers:
    """The subjects' handlers: requests read the ledger (only the acting account's,
    R-TEN-2); worker facts are checked against the subject they arrived on."""

    def __init__(self, billing: Billing, queries: Queries) -> None:
        self.billing = billing
        self.queries = queries

    async def balance(self, body: GetBalance, account: str) -> Balance:
        """The acting account's balance and unpaid earnings."""
        return await self.queries.balance(account)

    async def entries(self, body: EntriesQuery, account: str) -> Entries:
        """The acting account's ledger entries, newest first."""
        found = await self.queries.entries(
            account, body.limit, parse_time(body.from_), parse_time(body.to)
        )
        return Entries(entries=found)

    async def job_cost(self, body: JobCostQuery, account: str) -> JobCost:
        """What one job cost the acting account, by kind."""
        return await self.queries.job_cost(body.job_id, account)

    async def earnings(self, body: EarningsQuery, account: str) -> Earnings:
        """The acting account's earnings per node and region."""
        return await self.queries.earnings(account, parse_time(body.from_), parse_time(body.to))

    async def series(self, body: LedgerSeriesQuery, account: str) -> LedgerSeries:
        """The acting account's spending and earnings per hour or day."""
        return await self.queries.series(
            account, body.period, body.limit, parse_time(body.from_), parse_time(body.to)
        )

    async def device_added(self, body: DeviceAdded) -> None:
        """A device of an account: charged per day from then on (R-BILL-3)."""
        await self.billing.device_added(body)

    async def device_removed(self, body: DeviceRemoved) -> None:
        """A device gone: not charged after its day."""
        await self.billing.device_removed(body)

    # A worker fact counts only on the subject of the node its body names (the only one
    # that node may publish); billing then checks that node is the placement's.

    async def worker_started(self, body: WorkerStarted, delivery: Delivery) -> None:
        """A worker's start: from then on the clock bills each full hour."""
        if on_its_own_subject(delivery.subject, body.minion_id):
            await self.billing.worker_started(body, delivery.received_at or self.billing.clock())

    async def worker_finished(self, body: WorkerFinished, delivery: Delivery) -> None:
        """A worker's end: its run is settled to the exact total."""
        if on_its_own_subject(delivery.subject, body.minion_id):
            await self.billing.worker_finished(body, delivery.received_at or self.billing.clock())

    async def worker_events(self, batch: list[tuple[Message, Delivery]]) -> None:
        """Placements, starts and ends, a batch at a time: the batch's placements first, then
        its starts, then its ends (a worker's own facts come in that order: service.py), each
        kind applied together (placements.py: one transaction settles many runs). Batches
        spare a fetch, an ack and a few database round trips per fact, which kept billing
        far behind a fleet of short jobs (billing README)."""
        placed, started, finished = [], [], []
        for body, d in batch:
            at = d.received_at or self.billing.clock()
            if isinstance(body, WorkerPlaced):
                placed.append(body)
            elif isinstance(body, WorkerStarted) and on_its_own_subject(d.subject, body.minion_id):
                started.append((body, at))
            elif isinstance(body, WorkerFinished) and on_its_own_subject(d.subject, body.minion_id):
                finished.append((body, at))
        await self.billing.workers_placed(placed)
        await self.billing.workers_started(started)
        await self.billing.workers_finished(finished)


def build_app(ports: Ports, settings: BillingSettings | None = None) -> Service[Billing]:
    settings = settings or BillingSettings()
    billing = Billing(ports.db, ports.clock)
    on = Handlers(billing, Queries(ports.db.db))
    clock = Every(settings.tick_s, billing.tick, "billing-clock", grace_s=STOP_GRACE_S)
    billing.halted = lambda: clock.stopping  # its rounds stop between settlements
    rt = ServiceRuntime(SERVICE, ports, indexes=INDEXES)
    rt.wire(
        requests={
            "balance": on.balance,
            "entries": on.entries,
            "job_cost": on.job_cost,
            "earnings": on.earnings,
            "series": on.series,
        },
        events={
            # One consumer, in stream order: a placement before its node's facts (service.py),
            # which the scheduler states on the node's `kept` subject once it took them.
            "worker-events": Batched(
                # an upload (WorkerUploading) changes nothing: the run is billed to its end
                [WorkerPlaced, WorkerStarted, WorkerUploading, WorkerFinished],
                on.worker_events,
                subject=subjects.WORKER_EVENTS,
                type_subjects={
                    WorkerStarted: subjects.kept("started", "{minion_id}"),
                    WorkerUploading: subjects.kept("uploading", "{minion_id}"),
                    WorkerFinished: subjects.kept("finished", "{minion_id}"),
                },
                # under load, fewer and larger batches (one settlement each); a charge is
                # due within seconds of a run's end, not milliseconds
                linger_s=1.0,
            ),
            "device-added": on.device_added,
            "device-removed": on.device_removed,
            "provider-enabled": billing.provider_enabled,
        },
        every=[clock],
        # the series' running sums, built from the ledger once (running_totals.py)
        prepare=[partial(running_totals.ensure, ports.db)],
        metrics=[Source("ledger", BillingMetrics(ports.db.db).collect)],
        publishes=[
            UsageCharged,
            EarningCredited,
            FederatedFeeCharged,
            DeviceFeeCharged,
            PayoutMade,
        ],
    )
    return rt.built(billing)
