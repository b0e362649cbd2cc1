"""Clamping a node's claimed run times to what billing saw (H2)."""

from __future__ import annotations

from gpufleet_billing.periods import run_end_ms, run_start_ms


def test_a_start_is_kept_between_the_placement_and_its_receipt() -> None:
    assert run_start_ms(50, placed_ms=100, received_ms=200) == 100  # before placement
    assert run_start_ms(150, placed_ms=100, received_ms=200) == 150
    assert run_start_ms(900, placed_ms=100, received_ms=200) == 200  # in the future
    assert run_start_ms(900, placed_ms=None, received_ms=None) == 900  # nothing known
    # placed "after" the start was received: the scheduler's clock is ahead; ignored
    assert run_start_ms(150, placed_ms=300, received_ms=200) == 150


def test_an_end_is_kept_between_the_start_and_its_receipt() -> None:
    assert run_end_ms(50, started_ms=100, received_ms=200) == 100  # before the start
    assert run_end_ms(150, started_ms=100, received_ms=200) == 150
    assert run_end_ms(900, started_ms=100, received_ms=200) == 200
    assert run_end_ms(900, started_ms=None, received_ms=None) == 900
