"""Billing's Prometheus series (docs/metrics.md): what each account spent, what each node
earned its owner and what each node's runs cost, summed exactly (integer micro-credits) from
the ledger and exported in credits.

The sums are taken over the whole ledger, at most once per `refresh_s` (a scrape in between
gets the last sums): enough for a counter scraped every few seconds, and a bounded load on
the store whatever the scrape rate. A node is named by its minion id (as the agent and the
provisioner label it), found through the run's placement.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpufleet_store import Doc
from prometheus_client.metrics_core import CounterMetricFamily, Metric
from pymongo.asynchronous.database import AsyncDatabase

from .fees import EARNINGS_PREFIX, PLATFORM, from_micro

RUN_CHARGES = frozenset({"usage_fee", "market_price"})  # a payer's side of a run's charge
NOT_SPENT = frozenset({"payout"})  # moves earnings to their account: no spending
LEDGER_FIELDS = ("account", "kind", "amount_micro", "placement_id", "region")
PLACEMENT_FIELDS = ("minion_id", "node_owner", "region")


@dataclass
class LedgerTotals:
    spent: Counter[str] = field(default_factory=Counter)  # account -> micro
    earned: Counter[tuple[str, str, str]] = field(default_factory=Counter)  # account, node, region
    node_cost: Counter[tuple[str, str, str]] = field(default_factory=Counter)  # node, region, owner


def ledger_totals(entries: Iterable[Doc], placements: Mapping[str, Doc]) -> LedgerTotals:
    """Spent: an account's own entries but payouts, negated (a correction's refund lowers it).
    Earned: an earnings sub-account's entries but payouts, by the run's node. Node cost: the
    payers' side of the runs' usage and market charges, by node and its owner."""
    out = LedgerTotals()
    for e in entries:
        account, kind, amount = str(e["account"]), str(e["kind"]), int(e["amount_micro"])
        if kind in NOT_SPENT or account == PLATFORM:
            continue
        p = placements.get(str(e.get("placement_id") or ""), {})
        node = str(p.get("minion_id", ""))
        region = str(e.get("region") or p.get("region") or "")
        if account.startswith(EARNINGS_PREFIX):
            out.earned[(account.removeprefix(EARNINGS_PREFIX), node, region)] += amount
            continue
        out.spent[account] -= amount
        if kind in RUN_CHARGES and p:
            out.node_cost[(node, region, str(p.get("node_owner", "")))] += -amount
    return out


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
        entries = await self.db.ledger.find({}, dict.fromkeys(LEDGER_FIELDS, 1)).to_list(None)
        wanted = {str(e["placement_id"]) for e in entries if e.get("placement_id")}
        placements = {
            str(p["_id"]): p
            for p in await self.db.placements.find(
                {"_id": {"$in": sorted(wanted)}}, dict.fromkeys(PLACEMENT_FIELDS, 1)
            ).to_list(None)
        }
        return ledger_totals(entries, placements)
