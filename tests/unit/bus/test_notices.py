"""Noticing a sender's refusals at a rate it cannot raise (gpufleet_bus.notices)."""

from __future__ import annotations

from gpufleet_bus.notices import Notices


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_first_refusal_is_noticed_at_once_then_one_notice_a_window_counts_the_rest() -> None:
    clock = Clock()
    notices = Notices(60, clock=clock)
    first = notices.note("evil")
    assert first is not None and (first.key, first.count) == ("evil", 1)
    assert [notices.note("evil") for _ in range(10_000)] == [None] * 10_000
    clock.now = 59.9
    assert notices.note("evil") is None
    clock.now = 60.0
    later = notices.note("evil")
    assert later is not None and later.count == 10_002 and later.since_s == 60.0
    assert notices.note("evil") is None  # a new window began


def test_a_flood_that_stopped_is_told_at_the_next_look_and_a_quiet_key_starts_afresh() -> None:
    clock = Clock()
    notices = Notices(60, clock=clock)
    notices.note("evil", 5)
    notices.note("evil", 7)
    assert notices.due() == []
    clock.now = 61
    (told,) = notices.due()
    assert (told.key, told.count) == ("evil", 7)
    assert notices.due() == []
    clock.now = 1000  # quiet since: noticed at once again
    again = notices.note("evil")
    assert again is not None and again.count == 1 and again.since_s == 0


def test_one_senders_flood_does_not_hide_anothers_first() -> None:
    notices = Notices(60, clock=Clock())
    notices.note("evil")
    for _ in range(100):
        notices.note("evil")
    other = notices.note("other")
    assert other is not None and other.count == 1


def test_a_burst_is_noticed_one_at_a_time_and_the_rest_counted() -> None:
    clock = Clock()
    notices = Notices(60, burst=3, clock=clock)
    each = [notices.note("subject") for _ in range(10)]
    assert [n.count if n else None for n in each] == [1, 1, 1] + [None] * 7
    clock.now = 60
    later = notices.note("subject")
    assert later is not None and later.count == 8


def test_made_up_keys_cannot_grow_the_table() -> None:
    notices = Notices(60, max_keys=100, clock=Clock())
    for n in range(10_000):
        assert notices.note(f"k{n}") is not None  # each new: noticed (and the oldest go)
    assert len(notices._keys) == 100
