"""Time, as every service reads it: one clock type and one `utcnow` (a port: tests pass
their own clock to a service's build function)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

Clock = Callable[[], datetime]


def utcnow() -> datetime:
    return datetime.now(UTC)
