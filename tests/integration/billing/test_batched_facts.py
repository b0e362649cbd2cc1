"""Worker facts applied a batch at a time (placements.workers_*): the same ledger as one at
a time, whatever the batch holds (several runs, a copy of an end, an end whose placement
comes later, runs that never started), in one transaction per 64 ends."""

from __future__ import annotations

from datetime import datetime, timedelta

from gpufleet_billing.placements import FINISHED_PER_TRANSACTION
from gpufleet_contracts.jobs import WorkerFinished
from gpufleet_devstack import EmbeddedMongo

from .test_billing_support import T0, FakeClock, balances, billing_on, finished, placed, started

MIN = timedelta(minutes=1)


async def entries(store: object) -> list[tuple[str, int]]:
    ledger = store.db.ledger  # type: ignore[attr-defined]
    return sorted([(e["key"], e["amount_micro"]) async for e in ledger.find({})])


async def test_a_batch_settles_like_one_fact_at_a_time(
    mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    n = FINISHED_PER_TRANSACTION + 6  # two transactions of ends
    ends = {f"p{i}": T0 + (i + 1) * MIN for i in range(n)}
    late = "p-late"  # its end arrives before its placement: parked, applied with it

    one, one_store = await billing_on(mongo_server.url, db_prefix + "a", FakeClock(T0))
    for pid in ends:
        await one.worker_placed(placed(pid))
        await one.worker_started(started(pid), T0)
    await one.worker_finished(finished(late, T0 + 5 * MIN), T0 + 5 * MIN)
    await one.worker_placed(placed(late))
    for pid, end in ends.items():
        await one.worker_finished(finished(pid, end), end)
    await one.worker_placed(placed("never"))  # ended before it started: nothing to charge
    await one.worker_finished(finished("never", T0 + MIN, start=None), T0 + MIN)

    many, many_store = await billing_on(mongo_server.url, db_prefix + "b", FakeClock(T0))
    await many.workers_placed([placed(pid) for pid in ends])
    await many.workers_started([(started(pid), T0) for pid in ends])
    await many.workers_finished([(finished(late, T0 + 5 * MIN), T0 + 5 * MIN)])
    await many.workers_placed([placed(late), placed("never")])
    facts: list[tuple[WorkerFinished, datetime | None]] = [
        (finished(pid, end), end) for pid, end in ends.items()
    ]
    facts.insert(3, facts[0])  # a copy of an end within the batch
    facts.append((finished("never", T0 + MIN, start=None), T0 + MIN))
    written = await many.workers_finished(facts)
    assert written == 3 * n  # usage fee, market price, platform share per run: once each

    assert await entries(many_store) == await entries(one_store)
    assert await balances(many_store) == await balances(one_store)
    assert sum((await balances(many_store)).values()) == 0
    assert await many.workers_finished(facts) == 0  # redelivered: nothing more
    await one_store.close()
    await many_store.close()
