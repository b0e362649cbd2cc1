"""Billing's clock jumping an hour forward or back (a host's clock stepped, a VM resumed):
no hour is billed twice, none is skipped, and a run's total is its exact duration whatever
the clock said meanwhile (hourly charges are keyed by hour number; the end settles to the
target computed from the run's own times, clamped by the bus's timestamps, not the clock)."""

from __future__ import annotations

from datetime import timedelta

from gpufleet_devstack import EmbeddedMongo

from .test_billing_support import (
    HOUR,
    T0,
    FakeClock,
    balances,
    billing_on,
    finished,
    placed,
    started,
)

MIN = timedelta(minutes=1)
A100_HOUR = 2_780_000  # 2.78 credits per GPU-hour, in micro-credits


async def hour_keys(store: object) -> list[str]:
    ledger = store.db.ledger  # type: ignore[attr-defined]
    return sorted([e["key"] async for e in ledger.find({"account": "buyer"})])


async def test_a_clock_jumping_back_and_forward_bills_each_hour_once_and_the_exact_total(
    mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    clock = FakeClock(T0)
    billing, store = await billing_on(mongo_server.url, db_prefix, clock)
    await billing.worker_placed(placed("p1"))
    await billing.worker_started(started("p1"), T0)
    assert await billing.tick(T0 + HOUR + MIN) == 3  # hour 1
    # Back an hour: the same hour is due again by that clock; nothing is billed twice.
    assert await billing.tick(T0 + MIN) == 0
    assert await billing.tick(T0 + HOUR + MIN) == 0
    # Forward an hour past the truth (T0 + 1 h 2 min seen as T0 + 2 h 2 min): hour 2 early.
    assert await billing.tick(T0 + 2 * HOUR + 2 * MIN) == 3
    # Back to the truth: hour 2 is not billed again when it really ends.
    assert await billing.tick(T0 + 2 * HOUR + 3 * MIN) == 0
    assert await hour_keys(store) == ["market:p1:h1:buyer", "market:p1:h2:buyer"]
    # Forward again, by two hours this time, then the run ends at T0 + 2 h 30 min (its
    # WorkerFinished received then): the early hours are taken back to the exact total.
    assert await billing.tick(T0 + 4 * HOUR + 10 * MIN) == 6  # hours 3 and 4, early
    ended = T0 + 2.5 * HOUR
    assert await billing.worker_finished(finished("p1", ended), ended) == 3
    assert (await balances(store))["buyer"] == -int(2.5 * A100_HOUR)
    assert sum((await balances(store)).values()) == 0
    assert await billing.tick(T0 + 6 * HOUR) == 0  # ended: the clock bills nothing more
    await store.close()


async def test_a_clock_an_hour_behind_skips_no_hour_once_it_catches_up(
    mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    clock = FakeClock(T0)
    billing, store = await billing_on(mongo_server.url, db_prefix, clock)
    await billing.worker_placed(placed("p2"))
    await billing.worker_started(started("p2"), T0)
    # The clock is an hour behind for the first three hours: only 2 hours are seen due.
    assert await billing.tick(T0 + 3 * HOUR - HOUR + MIN) == 6
    # It is corrected (jumps forward an hour): the missing hour 3 is billed, once.
    assert await billing.tick(T0 + 3 * HOUR + MIN) == 3
    assert await hour_keys(store) == [f"market:p2:h{k}:buyer" for k in (1, 2, 3)]
    assert (await balances(store))["buyer"] == -3 * A100_HOUR
    # And the end, as the truth has it (3 h 20 min), adds only the last 20 minutes.
    ended = T0 + 3 * HOUR + 20 * MIN
    assert await billing.worker_finished(finished("p2", ended), ended) == 3
    assert (await balances(store))["buyer"] == -9_266_667  # 3 h 20 min x 2.78, rounded
    await store.close()


async def test_a_scheduler_clock_an_hour_ahead_does_not_erase_the_run(
    mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    """The placement's `placed_at` comes from the scheduler's clock. An hour ahead, it is after
    the bus received the worker's start: that cannot be true, so it bounds nothing; the run is
    billed from its start as the node and the bus saw it."""
    billing, store = await billing_on(mongo_server.url, db_prefix, FakeClock(T0))
    await billing.worker_placed(placed("p3", placed_at=T0 + HOUR))
    await billing.worker_started(started("p3", T0), T0 + MIN)
    ended = T0 + 30 * MIN
    assert await billing.worker_finished(finished("p3", ended), ended + MIN) == 3
    assert (await balances(store))["buyer"] == -A100_HOUR // 2
    await store.close()


async def test_a_scheduler_clock_an_hour_behind_bills_the_run_once(
    mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    billing, store = await billing_on(mongo_server.url, db_prefix, FakeClock(T0))
    await billing.worker_placed(placed("p4", placed_at=T0 - HOUR))
    await billing.worker_started(started("p4", T0), T0 + MIN)
    ended = T0 + 30 * MIN
    assert await billing.worker_finished(finished("p4", ended), ended + MIN) == 3
    assert await billing.worker_finished(finished("p4", ended), ended + MIN) == 0
    assert (await balances(store))["buyer"] == -A100_HOUR // 2
    await store.close()


async def test_an_agent_an_hour_behind_is_billed_the_time_its_run_took(
    mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    """The node's start and end, both an hour early by its clock: the start is kept at the
    placement, the end is that start plus the run's length on the node's own clock (it was
    clamped to the start before, and the run billed as nothing)."""
    clock = FakeClock(T0)
    billing, store = await billing_on(mongo_server.url, db_prefix, clock)
    await billing.worker_placed(placed("p1"))
    behind = T0 - HOUR
    await billing.worker_started(started("p1", behind), T0)
    ended = T0 + 30 * MIN
    assert await billing.worker_finished(finished("p1", ended - HOUR, behind), ended) == 3
    assert (await balances(store))["buyer"] == -int(0.5 * A100_HOUR)
    await store.close()
