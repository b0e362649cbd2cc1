"""Per-period sums of the console's charts: exact, charges as spending, payouts left out."""

from __future__ import annotations

from gpufleet_billing.series import MS_PER_DAY, Movement, summed

HOUR = 3_600_000


def test_spending_and_earnings_are_summed_per_day_oldest_first() -> None:
    day0 = 20_000 * MS_PER_DAY
    moves = [
        Movement(day0 + HOUR, -1_500_000, earning=False),  # a charge: 1.5 spent
        Movement(day0 + 2 * HOUR, -250_001, earning=False),
        Movement(day0 + 3 * HOUR, 10_000_000, earning=False),  # credits added: not spending
        Movement(day0 + MS_PER_DAY, 700_000, earning=True),
        Movement(day0 + MS_PER_DAY + 1, -700_000, earning=True, payout=True),
    ]
    sums = summed(moves, "day", 10)
    assert [(s.start_ms, s.spent_micro, s.earned_micro) for s in sums] == [
        (day0, 1_750_001, 0),
        (day0 + MS_PER_DAY, 0, 700_000),
    ]
    assert sums[0].start.endswith("T00:00:00+00:00")


def test_hours_and_the_newest_periods_kept() -> None:
    moves = [Movement(h * HOUR + 5, -1, earning=False) for h in range(5)]
    sums = summed(moves, "hour", 2)
    assert [s.start_ms for s in sums] == [3 * HOUR, 4 * HOUR]
