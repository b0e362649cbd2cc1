"""A job's shown run times: the node's claims kept within what the scheduler saw (H2)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpufleet_scheduler.reports import clamp_time

T = datetime(2025, 6, 2, 10, 0, tzinfo=UTC)
H = timedelta(hours=1)


def test_a_claimed_time_is_kept_between_the_stored_bound_and_its_receipt() -> None:
    assert clamp_time(T - 87_600 * H, T, T + H) == T  # ten years before the placement
    assert clamp_time(T + 9 * H, T, T + H) == T + H  # after it was received
    assert clamp_time(T + H / 2, T, T + H) == T + H / 2
    assert clamp_time(T - H, None, None) == T - H  # nothing known: as claimed
    naive = (T - H).replace(tzinfo=None)
    assert clamp_time(naive, T, None) == T  # a naive time is read as UTC
