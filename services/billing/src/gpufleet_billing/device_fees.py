"""R-BILL-3, pure: the device fee of one account for one UTC day.

A device counts on day D when it was configured at the start of D or added during D: its span
[added, removed) touches D. Removing a device lowers the next day's charge, not today's; a
device removed at exactly 00:00:00 UTC is not charged that day. Each addition is a distinct
device (a device id added, removed and added again counts once per span it touches).
"""

from __future__ import annotations

import calendar
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date
from decimal import Decimal

from .fees import PLATFORM, Posting, to_micro
from .periods import day_bounds_ms

DEVICE_FEE_PER_MONTH = Decimal(15)


@dataclass(frozen=True)
class DeviceSpan:
    device_id: str
    added_ms: int
    removed_ms: int | None = None


def days_in_month(day: date) -> int:
    return calendar.monthrange(day.year, day.month)[1]


def devices_charged(spans: Iterable[DeviceSpan], day: date) -> int:
    start, end = day_bounds_ms(day)
    return sum(
        1
        for s in spans
        if s.added_ms < end
        and (s.removed_ms is None or s.removed_ms > start or s.added_ms >= start)
    )


def day_fee_micro(count: int, day: date) -> int:
    """15 x count / days in that month, rounded once (half even) to the micro-credit."""
    return to_micro(DEVICE_FEE_PER_MONTH * count / days_in_month(day))


def device_fee_postings(account: str, count: int, day: date) -> list[Posting]:
    fee = day_fee_micro(count, day)
    return [Posting(account, -fee, "device_fee"), Posting(PLATFORM, fee, "device_fee")]
