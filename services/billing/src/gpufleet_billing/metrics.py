"""Billing's Prometheus series (docs/metrics.md): what each account spent, what each node
earned its owner and what each node's runs cost, summed exactly (integer micro-credits) and
exported in credits.

The sums are read from the `ledger_totals` collection (running_totals.py: one document per
series and labels, moved in the same transaction as the ledger entries it sums), so a scrape
costs the same whatever the ledger's size; at most once per `refresh_s` (a scrape in between
gets the last sums). The rules of what counts are totals.py's. A node is named by its minion
id (as the agent and the provisioner label it), found through the run's placement.
"""

from __future__ import annotations

import time

from gpufleet_store import Doc
from prometheus_client.metrics_core import CounterMetricFamily, Metric
from pymongo.asynchronous.database import AsyncDatabase

from . import running_totals
from .fees import from_micro
from .totals import LedgerTotals


def ledger_families(totals: LedgerTotals) -> list[Metric]:
    spent = CounterMetricFamily(
        "gpufleet_account_spent_credits",
        "Credits an account was charged (usage, market price, federated and device fees).",
        labels=("account",),
    )
    for account, micro in sorted(totals.spent.items()):
        spent.add_metric([account], float(from_micro(micro)))
    earned = CounterMetricFamily(
        "gpufleet_earnings_credits",
        "Credits earned by an account's nodes from other accounts' jobs (R-BILL-4).",
        labels=("account", "node", "region"),
    )
    for (account, node, region), micro in sorted(totals.earned.items()):
        earned.add_metric([account, node, region], float(from_micro(micro)))
    cost = CounterMetricFamily(
        "gpufleet_node_cost_credits",
        "Credits the runs on a node were charged to the accounts that ran them.",
        labels=("node", "region", "owner"),
    )
    for (node, region, owner), micro in sorted(totals.node_cost.items()):
        cost.add_metric([node, region, owner], float(from_micro(micro)))
    return [spent, earned, cost]


class BillingMetrics:
    def __init__(self, db: AsyncDatabase[Doc], refresh_s: float = 15.0) -> None:
        self.db = db
        self.refresh_s = refresh_s
        self._families: list[Metric] | None = None
        self._at = 0.0

    async def collect(self) -> list[Metric]:
        if self._families is None or time.monotonic() - self._at >= self.refresh_s:
            self._families = ledger_families(await self.totals())
            self._at = time.monotonic()
        return self._families

    async def totals(self) -> LedgerTotals:
        return await running_totals.read(self.db)
