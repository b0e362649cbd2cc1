"""R-BILL-3: every example of the rule, and months of 28, 29, 30 and 31 days."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest
from gpufleet_billing.device_fees import (
    DeviceSpan,
    day_fee_micro,
    days_in_month,
    device_fee_postings,
    devices_charged,
)
from gpufleet_billing.fees import PLATFORM
from gpufleet_billing.periods import day_bounds_ms, to_ms

JUNE_10 = date(2025, 6, 10)  # June has 30 days
START, END = day_bounds_ms(JUNE_10)
BEFORE = START - 86_400_000


def at(hour: int, day: date = JUNE_10) -> int:
    return to_ms(datetime(day.year, day.month, day.day, hour, tzinfo=UTC))


def fleet(n: int, prefix: str = "d") -> list[DeviceSpan]:
    return [DeviceSpan(f"{prefix}{i}", BEFORE) for i in range(n)]


def test_ten_devices_cost_five_a_day_in_a_30_day_month() -> None:
    assert devices_charged(fleet(10), JUNE_10) == 10
    assert day_fee_micro(10, JUNE_10) == 5_000_000


def test_start_with_ten_and_add_five_costs_seven_and_a_half() -> None:
    spans = fleet(10) + [DeviceSpan(f"n{i}", at(8 + i)) for i in range(5)]
    assert devices_charged(spans, JUNE_10) == 15
    assert day_fee_micro(15, JUNE_10) == 7_500_000


def test_removing_five_of_ten_lowers_the_next_day_not_today() -> None:
    spans = fleet(5) + [DeviceSpan(f"r{i}", BEFORE, at(12)) for i in range(5)]
    assert day_fee_micro(devices_charged(spans, JUNE_10), JUNE_10) == 5_000_000
    next_day = date(2025, 6, 11)
    assert day_fee_micro(devices_charged(spans, next_day), next_day) == 2_500_000


def test_adding_and_removing_one_device_five_times_counts_five_devices() -> None:
    spans = fleet(10) + [DeviceSpan(f"x{i}", at(1 + 2 * i), at(2 + 2 * i)) for i in range(5)]
    assert day_fee_micro(devices_charged(spans, JUNE_10), JUNE_10) == 7_500_000
    next_day = date(2025, 6, 11)
    assert day_fee_micro(devices_charged(spans, next_day), next_day) == 5_000_000


def test_a_device_removed_at_midnight_is_not_charged_that_day() -> None:
    assert devices_charged([DeviceSpan("a", BEFORE, START)], JUNE_10) == 0
    assert devices_charged([DeviceSpan("a", BEFORE, START + 1)], JUNE_10) == 1
    assert devices_charged([DeviceSpan("a", END)], JUNE_10) == 0  # added the next day


@pytest.mark.parametrize(
    "day,length,one_device_micro",
    [
        (date(2025, 2, 3), 28, 535_714),  # 15 / 28 = 0.5357142857 -> 0.535714
        (date(2024, 2, 3), 29, 517_241),  # 15 / 29 = 0.5172413793 -> 0.517241
        (date(2025, 4, 3), 30, 500_000),
        (date(2025, 1, 3), 31, 483_871),  # 15 / 31 = 0.4838709677 -> 0.483871
    ],
)
def test_month_lengths(day: date, length: int, one_device_micro: int) -> None:
    assert days_in_month(day) == length
    assert day_fee_micro(1, day) == one_device_micro
    # Rounded once per day entry, from the exact fraction: 7 devices is not 7 x the rounded fee.
    assert day_fee_micro(7, day) == round(15 * 7 * 1_000_000 / length)


def test_a_whole_month_of_ten_devices_costs_150_within_rounding() -> None:
    for first, length in [(date(2025, 2, 1), 28), (date(2025, 1, 1), 31)]:
        total = sum(day_fee_micro(10, first.replace(day=d)) for d in range(1, length + 1))
        assert abs(total - 150_000_000) <= length // 2


def test_postings_balance() -> None:
    ps = device_fee_postings("acme", 3, JUNE_10)
    assert [(p.account, p.amount_micro) for p in ps] == [
        ("acme", -1_500_000),
        (PLATFORM, 1_500_000),
    ]
