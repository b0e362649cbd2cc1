"""Time for the clock-driven charges: hour slices of a run and UTC days, in epoch ms."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, date, datetime, time, timedelta

from gpufleet_contracts.clock import aware

from .fees import MS_PER_HOUR

DAY = timedelta(days=1)


def to_ms(at: datetime) -> int:
    return int(aware(at).timestamp() * 1000)


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


def length_ms(start: datetime, end: datetime) -> int:
    """A run's length in whole milliseconds, cut from the exact length: not the difference
    of its two ends each cut to whole milliseconds, which is one more about half the time.
    The scheduler shows the same (its kept start, in whole milliseconds, plus the node's
    length, stored in whole milliseconds), so a job's shown run time and its bill agree."""
    return (aware(end) - aware(start)) // timedelta(milliseconds=1)


def run_end_ms(
    claimed_ms: int,
    started_ms: int | None,
    received_ms: int | None,
    claimed_length_ms: int | None = None,
) -> int:
    """A node's claimed end: not after its WorkerFinished was received, not before the start.

    With the run's length on the node's own clock (`claimed_length_ms`: its claimed start
    to its claimed end, `length_ms`), the end is the start billing kept plus that length:
    the node's clock offset cancels out. Without it, an agent an hour behind would have
    every run under an hour clamped to nothing (its end before the placement), and billed
    as nothing."""
    if claimed_length_ms is not None and started_ms is not None:
        claimed_ms = started_ms + max(0, claimed_length_ms)
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
