"""The heartbeat book (heartbeats.py): silence counted on evidence the node could not send."""

from __future__ import annotations

from gpufleet_provisioner.heartbeats import HeartbeatBook


def test_silence_counts_from_the_last_heartbeat_heard() -> None:
    book = HeartbeatBook(started_ms=0, late_ms=1000)
    book.heard("a", sent_ms=10_000, seq=1, now_ms=10_050)
    assert book.silent_ms("a", 15_050) == 5_000
    assert book.silent_ms("c", 15_050) == 0  # never heard: from when first asked about
    assert book.silent_ms("c", 25_050) == 10_000


def test_a_heartbeat_handled_late_means_we_are_behind_whatever_the_clocks() -> None:
    book = HeartbeatBook(started_ms=0, late_ms=1000)
    # a node whose clock is 7 s behind ours: its usual delay is learnt, not held against it
    for i in range(5):
        book.heard("skewed", sent_ms=i * 1000 - 7000, seq=i + 1, now_ms=i * 1000 + 20)
    assert book.behind_ms == 0
    # its next heartbeat handled 4 s after it was sent: our backlog, not its silence
    book.heard("skewed", sent_ms=5000 - 7000, seq=6, now_ms=9_000)
    assert book.behind_ms == 9_000
    book.heard("other", sent_ms=1000, seq=1, now_ms=1000)
    assert book.silent_ms("other", 9_500) == 500  # silence restarts after our lag


def test_the_sequence_tells_heartbeats_sent_but_never_heard() -> None:
    book = HeartbeatBook(started_ms=0)
    assert book.heard("a", 1000, 1, 1000) is None
    assert book.heard("a", 2000, 2, 2000) == 0
    assert book.heard("a", 9000, 9, 9000) == 6  # 3..8 were sent and lost on the way
    assert book.heard("a", 10_000, 1, 10_000) is None  # its agent restarted: unknown
    assert book.heard("b", 1000, None, 1000) is None  # an agent without sequence numbers


def test_an_older_heartbeat_handled_after_a_newer_one_changes_nothing() -> None:
    book = HeartbeatBook(started_ms=0, late_ms=10_000)
    book.heard("a", 5000, 5, 5000)
    book.heard("a", 4000, 4, 5100)
    assert book.nodes["a"].sent_ms == 5000 and book.nodes["a"].heard_ms == 5000


HOUR = 3_600_000


def beats(book: HeartbeatBook, node: str, start_s: int, n: int, offset_ms: int) -> None:
    """n heartbeats a second apart from a node whose clock reads `offset_ms` off ours."""
    for i in range(n):
        t = (start_s + i) * 1000
        book.heard(node, sent_ms=t + offset_ms, seq=start_s + i, now_ms=t + 20)


def test_a_node_clock_stepped_forward_is_no_lateness() -> None:
    book = HeartbeatBook(started_ms=0, late_ms=1000, relearn_ms=10_000)
    beats(book, "a", 1, 5, 0)
    beats(book, "a", 6, 30, HOUR)
    assert book.behind_ms == 0 and book.silent_ms("a", 36_000) == 980


def test_a_node_clock_stepped_back_holds_judging_back_once_then_not_at_all() -> None:
    """Its heartbeats look an hour late: our backlog, or its clock? A backlog drains, a step
    does not: after `relearn_ms` of it, its offset is learnt anew."""
    book = HeartbeatBook(started_ms=0, late_ms=1000, relearn_ms=10_000)
    beats(book, "a", 1, 5, 0)
    beats(book, "a", 6, 30, -HOUR)  # NTP stepped it back an hour at 6 s
    assert book.relearnt == 1
    assert 15_000 <= book.behind_ms <= 16_020  # behind only while learning: 6 s .. 16 s
    assert book.silent_ms("a", 36_000) == 980  # and every heartbeat was heard as the newest
    assert book.nodes["a"].seq == 35
    beats(book, "a", 36, 5, -HOUR)
    assert book.behind_ms <= 16_020


def test_a_node_clock_drifting_slow_is_learnt_not_held_against_us() -> None:
    book = HeartbeatBook(started_ms=0, late_ms=1000, relearn_ms=10_000)
    for i in range(1, 200):  # 20 ms slower every heartbeat: 4 s over the run
        book.heard("a", sent_ms=i * 1000 - i * 20, seq=i, now_ms=i * 1000)
    assert book.behind_ms < 200_000 - 20_000  # not behind for good


def test_a_real_backlog_is_still_seen_after_a_node_clock_was_relearnt() -> None:
    book = HeartbeatBook(started_ms=0, late_ms=1000, relearn_ms=10_000)
    beats(book, "a", 1, 5, 0)
    beats(book, "a", 6, 20, -HOUR)
    book.heard("a", sent_ms=26_000 - HOUR, seq=26, now_ms=30_000)  # handled 4 s late
    assert book.behind_ms == 30_000
