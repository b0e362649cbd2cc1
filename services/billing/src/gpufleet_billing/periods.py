"""Time for the clock-driven charges: hour slices of a run and UTC days, in epoch ms."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, date, datetime, time, timedelta

from .fees import MS_PER_HOUR

DAY = timedelta(days=1)


def to_ms(at: datetime) -> int:
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return int(at.timestamp() * 1000)


def from_ms(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


def full_hours(started_ms: int, until_ms: int) -> int:
    """How many whole running hours lie between the start and `until_ms`."""
    return max(0, (until_ms - started_ms) // MS_PER_HOUR)


def run_start_ms(claimed_ms: int, placed_ms: int | None, received_ms: int | None) -> int:
    """A node's claimed start, kept within what billing saw: not after the event carrying it
    was received (the bus's timestamp), not before the worker was placed. A placement time
    after that receipt cannot be true (the scheduler's clock is ahead): it bounds nothing."""
    ms = claimed_ms if received_ms is None else min(claimed_ms, received_ms)
    if placed_ms is None or (received_ms is not None and placed_ms > received_ms):
        return ms
    return max(ms, placed_ms)


def run_end_ms(
    claimed_ms: int,
    started_ms: int | None,
    received_ms: int | None,
    claimed_start_ms: int | None = None,
) -> int:
    """A node's claimed end: not after its WorkerFinished was received, not before the start.

    With the node's own claimed start (`claimed_start_ms`, from the same clock as its end),
    the end is the start billing kept plus the run's length on the node's clock: the node's
    clock offset cancels out. Without it, an agent an hour behind would have every run under
    an hour clamped to nothing (its end before the placement), and billed as nothing."""
    if claimed_start_ms is not None and started_ms is not None:
        claimed_ms = started_ms + max(0, claimed_ms - claimed_start_ms)
    ms = claimed_ms if received_ms is None else min(claimed_ms, received_ms)
    return ms if started_ms is None else max(ms, started_ms)


def day_of(ms: int) -> date:
    return from_ms(ms).date()


def day_bounds_ms(day: date) -> tuple[int, int]:
    start = datetime.combine(day, time(0), tzinfo=UTC)
    return to_ms(start), to_ms(start + DAY)


def days(first: date, stop: date) -> Iterator[date]:
    """first, first + 1, ..., the day before `stop`."""
    d = first
    while d < stop:
        yield d
        d += DAY
