"""Time, as every service reads it: one clock type and one `utcnow` (a port: tests pass
their own clock to a service's build function).

`GPUFLEET_CLOCK_OFFSET_S` (development and fault tests only): when set, `configured_clock`
returns a clock that many seconds ahead (negative: behind) of the host's, as if the
service's host clock had been stepped; `run_service` gives it to every service. Unset: the
plain `utcnow`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta

Clock = Callable[[], datetime]

CLOCK_OFFSET_ENV = "GPUFLEET_CLOCK_OFFSET_S"


def utcnow() -> datetime:
    return datetime.now(UTC)


def aware(at: datetime) -> datetime:
    """`at` with a time zone: a naive one (as a store or a client may give it) read as UTC."""
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def offset_clock(offset_s: float, base: Clock = utcnow) -> Clock:
    """`base` shifted by `offset_s` seconds."""
    shift = timedelta(seconds=offset_s)

    def clock() -> datetime:
        return base() + shift

    return clock


def configured_clock(environ: Mapping[str, str] | None = None) -> Clock:
    """The process's clock: `utcnow`, offset by `GPUFLEET_CLOCK_OFFSET_S` only when it is set.

    A value that is not a number raises ValueError naming the variable."""
    raw = (os.environ if environ is None else environ).get(CLOCK_OFFSET_ENV, "").strip()
    if not raw:
        return utcnow
    try:
        offset = float(raw)
    except ValueError:
        raise ValueError(f"{CLOCK_OFFSET_ENV}: must be a number of seconds, got {raw!r}") from None
    return offset_clock(offset)
