"""Billing's /metrics sums, read from the real ledger a market run left."""

from __future__ import annotations

from gpufleet_billing.metrics import BillingMetrics
from gpufleet_devstack import EmbeddedMongo

from .test_billing_support import HOUR, T0, FakeClock, billing_on, finished, placed, started


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
