"""Clamping a node's claimed run times to what billing saw (H2)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpufleet_billing.periods import length_ms, run_end_ms, run_start_ms, to_ms


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


def test_a_runs_end_is_its_length_on_the_nodes_own_clock_from_the_kept_start() -> None:
    hour = 3_600_000
    placed, received_start, received_end = 10 * hour, 10 * hour + 50, 10 * hour + 1_800_100
    # an agent an hour behind: it claims a start before the placement and an end 30 min later
    claimed_start, claimed_end = placed - hour + 40, placed - hour + 40 + 1_800_000
    start = run_start_ms(claimed_start, placed_ms=placed, received_ms=received_start)
    assert start == placed
    assert run_end_ms(claimed_end, start, received_end) == start  # alone: clamped to nothing
    end = run_end_ms(claimed_end, start, received_end, claimed_end - claimed_start)
    assert end - start == 1_800_000  # with its own start: the 30 minutes it ran
    # an agent an hour ahead: the end is still not after its receipt
    ahead = run_end_ms(placed + hour + 9 * hour, placed, received_end, 9 * hour)
    assert ahead == received_end


def test_a_runs_length_is_cut_to_whole_milliseconds_as_the_scheduler_shows_it() -> None:
    """The scheduler shows a run as its kept start (whole milliseconds, as stored) plus the
    node's length, stored in whole milliseconds: the exact length, cut. Billing took the
    difference of the two ends each cut, one more about half the time (a CI run: 0.069812
    -> 0.592538 s, shown 522 ms, billed 523: at 8 CPUs and 0.0125 a CPU-hour 14.50 and
    14.53 micro-credits, rounded 14 and 15)."""
    t0 = datetime(2026, 11, 24, 3, 20, 52, tzinfo=UTC)
    for start_us, end_us in [(69_812, 592_538), (999, 1_000), (1_000, 1_999), (5, 5)]:
        start, end = t0 + timedelta(microseconds=start_us), t0 + timedelta(microseconds=end_us)
        kept = to_ms(start)
        billed = run_end_ms(to_ms(end), kept, None, length_ms(start, end)) - kept
        assert billed == (end_us - start_us) // 1000, (start_us, end_us)
    assert (
        to_ms(t0 + timedelta(microseconds=592_538)) - to_ms(t0 + timedelta(microseconds=69_812))
        == 523
    )
