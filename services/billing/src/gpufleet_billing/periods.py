"""Time for the clock-driven charges: hour slices of a run and UTC days, in epoch ms."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime, time, timedelta

from .fees import MS_PER_HOUR

Clock = Callable[[], datetime]
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
