"""Billing's /metrics sums, read from the real ledger's running totals: equal to the sums
over the whole ledger after charges, corrections, payouts, redeliveries and restarts."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from gpufleet_billing import ledger, running_totals
from gpufleet_billing.metrics import BillingMetrics, ledger_families
from gpufleet_billing.totals import LedgerTotals
from gpufleet_contracts.providers import PaymentMode, ProviderEnabled, ProviderKind
from gpufleet_devstack import EmbeddedMongo
from gpufleet_store import Store
from pymongo.errors import BulkWriteError

from ..conftest import store_for
from .test_billing_support import (
    HOUR,
    T0,
    FakeClock,
    added,
    billing_on,
    finished,
    placed,
    started,
)


async def test_spent_earned_and_node_cost_from_the_ledger(
    mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    clock = FakeClock(T0)
    billing, store = await billing_on(mongo_server.url, db_prefix, clock)
    await billing.worker_placed(placed("p1"))
    await billing.worker_started(started("p1"))
    assert await billing.worker_finished(finished("p1", T0 + 2.5 * HOUR)) == 3
    metrics = BillingMetrics(store.db, refresh_s=0)
    out = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in await metrics.collect()
        for s in f.samples
    }
    # R-BILL-4: A100 80GB at 2.78 for 2.5 h; the owner earns (2.78 - 0.25) / 2 per GPU-hour
    assert out == {
        ("gpufleet_account_spent_credits_total", (("account", "buyer"),)): 6.95,
        (
            "gpufleet_earnings_credits_total",
            (("account", "seller"), ("node", "m-a"), ("region", "east")),
        ): 3.1625,
        (
            "gpufleet_node_cost_credits_total",
            (("node", "m-a"), ("owner", "seller"), ("region", "east")),
        ): 6.95,
    }
    await store.close()


def exact(t: LedgerTotals) -> tuple[dict[Any, int], ...]:
    """As plain dicts: a series at zero differs from none (Counters compare them equal)."""
    return dict(t.spent), dict(t.earned), dict(t.node_cost)


async def same_as_the_whole_ledger(store: Store) -> LedgerTotals:
    """The running sums, the series /metrics serves and the sums over the whole ledger agree."""
    whole = await running_totals.whole_ledger(store.db)
    assert exact(await running_totals.read(store.db)) == exact(whole)
    served = await BillingMetrics(store.db, refresh_s=0).collect()
    assert [f.samples for f in served] == [f.samples for f in ledger_families(whole)]
    return whole


async def test_running_sums_equal_the_whole_ledger_through_charges_corrections_and_restarts(
    mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    clock = FakeClock(T0)
    billing, store = await billing_on(mongo_server.url, db_prefix, clock)
    assert await running_totals.ensure(store)  # a new database: built, from nothing
    await billing.provider_enabled(
        ProviderEnabled(
            account="seller",
            provider=ProviderKind.physical,
            payment_mode=PaymentMode.credits,
            at=T0 - timedelta(days=1),
        )
    )
    await billing.worker_placed(placed("p1"))
    await billing.worker_started(started("p1"))
    await billing.worker_placed(
        placed("p2", charge="usage", payer="owner", node_owner="owner", creator="guest",
               gpu_model="RTX 3090", rate=Decimal("0.05"), gpu_count=2)
    )  # fmt: skip
    await billing.worker_started(started("p2"))
    await billing.device_added(added("d1", T0))
    assert await billing.tick(T0 + 3 * HOUR) > 0  # three hours of each run, billed early
    # p1 really ended after 90 minutes (its node was down): the end refunds 1.5 hours
    assert await billing.worker_finished(finished("p1", T0 + 1.5 * HOUR)) == 3
    before = await same_as_the_whole_ledger(store)
    assert before.spent["buyer"] == 4_170_000  # 1.5 h x 2.78
    assert await billing.worker_finished(finished("p1", T0 + 1.5 * HOUR)) == 0  # redelivered
    entries = await store.db.ledger.find({"stage": "end"}).to_list(None)
    with pytest.raises(BulkWriteError):  # another process settled the same stage first
        await store.transaction(lambda tx: ledger.insert(store.db, tx, entries))
    assert exact(await same_as_the_whole_ledger(store)) == exact(before)
    await store.close()

    # Restarted: the sums are kept, not built again, and go on from where they were.
    billing, store = await billing_on(mongo_server.url, db_prefix, FakeClock(T0))
    assert not await running_totals.ensure(store)
    assert await billing.worker_finished(finished("p2", T0 + 4 * HOUR)) > 0
    assert await billing.tick(T0 + timedelta(days=2, minutes=1)) > 0  # device fees, payouts
    assert await store.db.ledger.count_documents({"kind": "payout"}) == 2  # day 1's, both sides
    after = await same_as_the_whole_ledger(store)
    assert after.earned[("seller", "m-a", "east")] == 1_897_500  # 1.5 h x 1.265, before payouts
    assert after.spent["acme"] == 2 * 500_000  # 15 credits x 1 device / 30 days, two days
    await store.close()


async def test_an_existing_ledger_is_summed_once_and_again_when_the_rules_change(
    mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    billing, store = await billing_on(mongo_server.url, db_prefix, FakeClock(T0))
    for pid in ("p1", "p2"):
        await billing.worker_placed(placed(pid))
        await billing.worker_started(started(pid))
        await billing.worker_finished(finished(pid, T0 + 2 * HOUR))
    # a ledger written before the running sums existed
    await store.db.drop_collection(running_totals.TOTALS)
    assert await running_totals.read(store.db) == LedgerTotals()
    other = store_for("billing", mongo_server.url, db_prefix)  # a second process starting
    built = await asyncio.gather(running_totals.ensure(store), running_totals.ensure(other))
    assert sorted(built) == [False, True]  # one built them, the other found them built
    await other.close()
    whole = await same_as_the_whole_ledger(store)
    assert whole.spent["buyer"] == 2 * 5_560_000
    assert not await running_totals.ensure(store)  # once
    # sums of an older version of the rules (here: wrong ones) are replaced by a rebuild
    await store.db[running_totals.TOTALS].update_many({}, {"$inc": {"micro": 1}})
    await store.db[running_totals.TOTALS].update_one(
        {"_id": running_totals.MARKER}, {"$set": {"version": running_totals.TOTALS_VERSION - 1}}
    )
    assert await running_totals.ensure(store)
    assert exact(await same_as_the_whole_ledger(store)) == exact(whole)
    await store.close()
