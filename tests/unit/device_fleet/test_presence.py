"""Whether a device is online, on plain data: heard within three of its heartbeat periods
(never offline sooner than the floor), offline after that or when never heard."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from gpufleet_contracts.devices import DevicePresence
from gpufleet_device_fleet.presence import DEFAULT_PERIOD_S, OFFLINE_MIN_S, presence

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
ON, OFF = DevicePresence.online, DevicePresence.offline


def ago(s: float) -> datetime:
    return NOW - timedelta(seconds=s)


@pytest.mark.parametrize(
    ("silent_s", "period_s", "want"),
    [
        (0, 15.0, ON),
        (45, 15.0, ON),  # three periods
        (45.5, 15.0, OFF),
        (29, 1.0, ON),  # a short period: the floor
        (OFFLINE_MIN_S + 1, 1.0, OFF),
        (3 * DEFAULT_PERIOD_S, None, ON),  # no heartbeat yet said its period (a report)
        (3 * DEFAULT_PERIOD_S + 1, None, OFF),
        (-5, 15.0, ON),  # heard after `now` was read
    ],
)
def test_online_within_three_periods_or_the_floor(
    silent_s: float, period_s: float | None, want: DevicePresence
) -> None:
    assert presence(ago(silent_s), period_s, NOW) is want


def test_never_heard_is_offline() -> None:
    assert presence(None, 15.0, NOW) is OFF
    assert presence(None, None, NOW) is OFF
