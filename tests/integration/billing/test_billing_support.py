"""Builders and a fake clock for the billing integration tests (no tests of its own)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from gpufleet_billing.service import INDEXES, Billing
from gpufleet_contracts.devices import DeviceAdded, DeviceRemoved
from gpufleet_contracts.jobs import WorkerFinished, WorkerPlaced, WorkerStarted, WorkerState
from gpufleet_store import Store

from ..conftest import store_for

T0 = datetime(2025, 6, 2, 10, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)


class FakeClock:
    def __init__(self, now: datetime = T0) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


async def billing_on(url: str, prefix: str, clock: FakeClock) -> tuple[Billing, Store]:
    store = store_for("billing", url, prefix)
    await store.ensure_indexes(INDEXES)
    return Billing(store, clock), store


def placed(pid: str, **kw: Any) -> WorkerPlaced:
    fields: dict[str, Any] = {
        "job_id": f"job-{pid}",
        "worker": 0,
        "placement_id": pid,
        "node_id": "node-a",
        "minion_id": "m-a",
        "region": "east",
        "gpu_model": "A100 80GB",
        "gpu_indices": [0],
        "gpu_count": 1,
        "rate": Decimal("2.78"),
        "charge": "market",
        "payer": "buyer",
        "node_owner": "seller",
        "creator": "buyer",
        "placed_at": T0,
    }
    fields.update(kw)
    return WorkerPlaced(**fields)


def started(pid: str, at: datetime = T0) -> WorkerStarted:
    return WorkerStarted(
        job_id=f"job-{pid}", worker=0, placement_id=pid, minion_id="m-a", started_at=at
    )


def finished(pid: str, ended: datetime, start: datetime | None = T0) -> WorkerFinished:
    return WorkerFinished(
        job_id=f"job-{pid}",
        worker=0,
        placement_id=pid,
        minion_id="m-a",
        state=WorkerState.finished,
        exit_code=0,
        started_at=start,
        ended_at=ended,
    )


def added(device: str, at: datetime, account: str = "acme") -> DeviceAdded:
    return DeviceAdded(device_id=device, account=account, region="edge", model="jetson", at=at)


def removed(device: str, at: datetime, account: str = "acme") -> DeviceRemoved:
    return DeviceRemoved(device_id=device, account=account, region="edge", at=at)


async def balances(store: Store) -> dict[str, int]:
    out: dict[str, int] = {}
    async for e in store.db.ledger.find({}):
        out[e["account"]] = out.get(e["account"], 0) + int(e["amount_micro"])
    return out
