"""When a waiter may take the scheduler's lease (leadership.lease_free): on durations it
measured itself, never on a time another host wrote."""

from __future__ import annotations

from gpufleet_scheduler.leadership import Seen, lease_free

DOC = {"owner": "a", "epoch": 3, "renewals": 7, "ttl_ms": 10_000}


def test_free_once_unchanged_for_the_holders_ttl_on_the_waiters_clock() -> None:
    seen = Seen(("a", 3, 7), since_ms=50)
    assert not lease_free(DOC, seen, 10_049, ttl_ms=1)  # the holder's TTL, not ours
    assert lease_free(DOC, seen, 10_050, ttl_ms=1)


def test_a_renewal_restarts_the_count() -> None:
    assert not lease_free(DOC, Seen(("a", 3, 6), since_ms=0), 10**9, ttl_ms=10_000)
    assert not lease_free(DOC, None, 10**9, ttl_ms=10_000)


def test_a_wall_clock_time_in_the_document_is_ignored() -> None:
    doc = DOC | {"renewed_at": 0, "expires_ms": 1}  # written by a clock an epoch behind
    assert not lease_free(doc, Seen(("a", 3, 7), since_ms=0), 1, ttl_ms=10_000)


def test_a_released_lease_is_free_at_once() -> None:
    assert lease_free(DOC | {"released": 1}, None, 0, ttl_ms=10_000)  # nx-27017: True as 1
    assert lease_free(DOC | {"expires_ms": 0}, None, 0, ttl_ms=10_000)  # an older version's
