"""Billing events (PRODUCT.md section 8): one per ledger entry, published through the outbox
with the entry's key as its id (`ce-id` = `Nats-Msg-Id`), so a consumer sees each entry once.

Amounts are integer micro-credits (1 credit = 1,000,000), exact; negative = charged.
"""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal
from typing import Literal

from pydantic import BaseModel, Field

from . import subjects
from .base import Command, Event
from .fields import Int, Name


class LedgerEntryEvent(Event):
    """Fields every ledger-entry event carries."""

    entry_key: str
    account: str
    kind: str = ""
    amount_micro: Int
    at: datetime


class UsageCharged(LedgerEntryEvent):
    """Usage of one worker's run at the locked rate (R-BILL-1, R-BILL-4): the payer's charge,
    the platform's share, for an hour slice or the remainder at stop."""

    TYPE = "gpufleet.billing.usage_charged.v1"
    SUBJECT = subjects.event("billing", "usage_charged")
    job_id: str
    worker: Int
    gpu_count: Int
    rate: Decimal  # per GPU-hour, or per CPU-hour for a CPU-only worker (cpu_count > 0)
    seconds: Int
    placement_id: str = ""
    cpu_count: Int = 0  # a CPU-only worker's CPUs (R-JOB-2)


class EarningCredited(LedgerEntryEvent):
    """A node owner's earning for capacity sold to another account (R-BILL-4), credited to the
    owner's earnings sub-account (`account` = `earnings:<owner>`)."""

    TYPE = "gpufleet.billing.earning_credited.v1"
    SUBJECT = subjects.event("billing", "earning_credited")
    owner: str
    job_id: str
    worker: Int
    placement_id: str
    node_id: str = ""
    region: Name = ""
    seconds: Int


class FederatedFeeCharged(LedgerEntryEvent):
    """The hourly fee of a cross-project job, charged to its creator (R-BILL-2)."""

    TYPE = "gpufleet.billing.federated_fee_charged.v1"
    SUBJECT = subjects.event("billing", "federated_fee_charged")
    job_id: str
    worker: Int
    placement_id: str
    job_type: str
    seconds: Int


class DeviceFeeCharged(LedgerEntryEvent):
    """One UTC day's device fee of an account (R-BILL-3), or a correction of it."""

    TYPE = "gpufleet.billing.device_fee_charged.v1"
    SUBJECT = subjects.event("billing", "device_fee_charged")
    day: date
    devices: Int


class PayoutMade(LedgerEntryEvent):
    """Accumulated earnings moved into the billing account (R-PROV-1 `credits`, every 24 h)."""

    TYPE = "gpufleet.billing.payout_made.v1"
    SUBJECT = subjects.event("billing", "payout_made")
    owner: str
    day: date


# --- requests and replies of billing (rpc.billing.<verb>.<account>) --------------------------


class Balance(BaseModel):
    account: str
    balance: str  # Decimal credits, exact
    balance_micro: int
    entries: int
    earnings_unpaid: str
    earnings_unpaid_micro: int


class GetBalance(Command):
    """The acting account's balance and unpaid earnings (no fields)."""

    TYPE = "gpufleet.billing.balance.v1"
    SUBJECT = subjects.rpc("billing", "balance")
    REPLY = Balance
    READ = True


class Range(Command):
    """A time range of ledger entries: ISO dates or date-times (naive = UTC)."""

    from_: str | None = Field(default=None, alias="from", description="ISO date or date-time")
    to: str | None = Field(default=None, description="ISO date or date-time (exclusive)")


class Earnings(BaseModel):
    account: str
    earned: str
    earned_micro: int
    paid_out: str
    paid_out_micro: int
    by_node: list[NodeEarnings]
    by_region: list[RegionEarnings]


class EarningsQuery(Range):
    """The acting account's earnings per node and region, and its payouts, in a range."""

    TYPE = "gpufleet.billing.earnings.v1"
    SUBJECT = subjects.rpc("billing", "earnings")
    REPLY = Earnings
    READ = True


class Entries(BaseModel):
    entries: list[Entry]


class EntriesQuery(Range):
    """The acting account's ledger entries, newest first."""

    TYPE = "gpufleet.billing.entries.v1"
    SUBJECT = subjects.rpc("billing", "entries")
    REPLY = Entries
    READ = True
    limit: Int = Field(default=50, ge=1, le=1000)


Period = Literal["hour", "day"]


class SeriesPoint(BaseModel):
    """One period's sums: what the account spent (charges, as a positive amount) and earned
    (its nodes' earnings, payouts left out), exact."""

    start: str  # ISO date-time (UTC) the period begins
    spent: str
    spent_micro: int
    earned: str
    earned_micro: int


class LedgerSeries(BaseModel):
    account: str
    period: Period
    points: list[SeriesPoint]  # oldest first; only periods with an entry


class LedgerSeriesQuery(Range):
    """The acting account's spending and earnings summed per hour or per day (a range's
    charts), oldest first."""

    TYPE = "gpufleet.billing.series.v1"
    SUBJECT = subjects.rpc("billing", "series")
    REPLY = LedgerSeries
    READ = True
    period: Period = "day"
    limit: Int = Field(default=400, ge=1, le=2000)  # periods, the newest kept


class JobCost(BaseModel):
    job_id: str
    cost: str
    cost_micro: int
    by_kind: dict[str, KindCost]
    entries: list[Entry]


class JobCostQuery(Command):
    """What one job cost the acting account, by kind of charge."""

    TYPE = "gpufleet.billing.job_cost.v1"
    SUBJECT = subjects.rpc("billing", "job_cost")
    REPLY = JobCost
    READ = True
    job_id: str


class Entry(BaseModel):
    """One ledger entry as an account reads it."""

    key: str
    account: str
    kind: str
    amount: str
    amount_micro: int
    job_id: str | None = None
    worker: int | None = None
    day: str | None = None
    at: str  # ISO date-time
    memo: str | None = None


class KindCost(BaseModel):
    cost: str
    cost_micro: int


class NodeEarnings(BaseModel):
    node_id: str
    region: str
    earned: str
    earned_micro: int


class RegionEarnings(BaseModel):
    region: str
    earned: str
    earned_micro: int
