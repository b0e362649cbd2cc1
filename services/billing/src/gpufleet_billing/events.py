"""The event published for each ledger entry, chosen by its group and kind."""

from __future__ import annotations

from datetime import date
from decimal import Decimal

from gpufleet_contracts.base import Event
from gpufleet_contracts.billing import (
    DeviceFeeCharged,
    EarningCredited,
    FederatedFeeCharged,
    PayoutMade,
    UsageCharged,
)
from gpufleet_store import Doc

from .fees import EARNINGS_PREFIX


def event_for(e: Doc) -> Event:
    common: Doc = {
        "entry_key": e["key"],
        "account": e["account"],
        "kind": e["kind"],
        "amount_micro": e["amount_micro"],
        "at": e["at"],
    }
    kind = e["kind"]
    if kind == "device_fee":
        return DeviceFeeCharged(**common, day=date.fromisoformat(e["day"]), devices=e["devices"])
    if kind == "payout":
        return PayoutMade(**common, owner=e["owner"], day=date.fromisoformat(e["day"]))
    worker: Doc = {
        "job_id": e["job_id"],
        "worker": e["worker"],
        "placement_id": e["placement_id"],
        "seconds": e["covered_ms"] // 1000,
    }
    if kind == "earning":
        owner = e["account"].removeprefix(EARNINGS_PREFIX)
        return EarningCredited(
            **common, **worker, owner=owner, node_id=e["node_id"], region=e["region"]
        )
    if kind == "federated_fee":
        return FederatedFeeCharged(**common, **worker, job_type=e["job_type"])
    return UsageCharged(
        **common,
        **worker,
        gpu_count=e["gpu_count"],
        rate=Decimal(e["rate"]),
        cpu_count=int(e.get("cpu_count") or 0),
    )
