"""The heartbeat book (heartbeats.py): silence counted on evidence the node could not send."""

from __future__ import annotations

from gpufleet_provisioner.heartbeats import HeartbeatBook


def test_silence_counts_from_the_last_heartbeat_heard() -> None:
    book = HeartbeatBook(started_ms=0, late_ms=1000)
    book.heard("a", sent_ms=10_000, seq=1, now_ms=10_050)
    assert book.silent_ms("a", None, 15_050) == 5_000
    assert book.silent_ms("b", 12_000, 15_050) == 3_050  # only stored: from its last seen
    assert book.silent_ms("c", None, 15_050) == 15_050  # never heard: since we started


def test_a_heartbeat_handled_late_means_we_are_behind_whatever_the_clocks() -> None:
    book = HeartbeatBook(started_ms=0, late_ms=1000)
    # a node whose clock is 7 s behind ours: its usual delay is learnt, not held against it
    for i in range(5):
        book.heard("skewed", sent_ms=i * 1000 - 7000, seq=i + 1, now_ms=i * 1000 + 20)
    assert book.behind_ms == 0
    # its next heartbeat handled 4 s after it was sent: our backlog, not its silence
    book.heard("skewed", sent_ms=5000 - 7000, seq=6, now_ms=9_000)
    assert book.behind_ms == 9_000
    assert book.silent_ms("other", 1_000, 9_500) == 500  # silence restarts after our lag


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
