"""The clock port's development offset (GPUFLEET_CLOCK_OFFSET_S)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from gpufleet_contracts.clock import configured_clock, offset_clock, utcnow

T = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def test_unset_or_empty_is_the_plain_clock() -> None:
    assert configured_clock({}) is utcnow
    assert configured_clock({"GPUFLEET_CLOCK_OFFSET_S": " "}) is utcnow


@pytest.mark.parametrize(("raw", "shift"), [("3600", 3600), ("-3600", -3600), ("1.5", 1.5)])
def test_an_offset_shifts_the_clock_by_that_many_seconds(raw: str, shift: float) -> None:
    now = configured_clock({"GPUFLEET_CLOCK_OFFSET_S": raw})()
    assert abs((now - utcnow()) - timedelta(seconds=shift)) < timedelta(seconds=5)
    assert offset_clock(shift, lambda: T)() == T + timedelta(seconds=shift)


def test_a_value_that_is_not_a_number_is_refused_naming_the_variable() -> None:
    with pytest.raises(ValueError, match="GPUFLEET_CLOCK_OFFSET_S: must be a number"):
        configured_clock({"GPUFLEET_CLOCK_OFFSET_S": "an hour"})
