"""Whether a device is online (pure): heard within a few of its own heartbeat periods, and
never sooner offline than a floor that rides out a slow link. Liveness only: an offline
device keeps its state and is still charged (R-BILL-3)."""

from __future__ import annotations

from datetime import datetime

from gpufleet_contracts.devices import DevicePresence

OFFLINE_AFTER_PERIODS = 3  # heartbeat periods of silence
OFFLINE_MIN_S = 30.0
DEFAULT_PERIOD_S = 15.0  # the agent's default, before a heartbeat said its own


def presence(
    last_seen: datetime | None,
    period_s: float | None,
    now: datetime,
    *,
    periods: int = OFFLINE_AFTER_PERIODS,
    min_s: float = OFFLINE_MIN_S,
) -> DevicePresence:
    """`online` while the last heartbeat (or report) is at most `periods` of the device's
    period old (at least `min_s`); `offline` after that, or when it was never heard."""
    if last_seen is None:
        return DevicePresence.offline
    silent_s = (now - last_seen).total_seconds()
    limit_s = max(periods * (period_s or DEFAULT_PERIOD_S), min_s)
    return DevicePresence.online if silent_s <= limit_s else DevicePresence.offline
