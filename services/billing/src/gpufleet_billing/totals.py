"""What billing's series sum, as pure rules: each account's spending, what each node earned
its owner and what each node's runs cost, from ledger entries and their runs' placements.

The sums are additive: the totals of a list of entries are the totals of any split of it,
added (`LedgerTotals.add`), so the same rules give both the running sums kept beside the
ledger (running_totals.py: one batch of entries at a time) and a sum over the whole ledger.
Each sum is a `TotalRow` (one per series and labels), the form they are stored in.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpufleet_store import Doc

from .fees import EARNINGS_PREFIX, PLATFORM

RUN_CHARGES = frozenset({"usage_fee", "market_price"})  # a payer's side of a run's charge
NOT_SPENT = frozenset({"payout"})  # moves earnings to their account: no spending
LEDGER_FIELDS = ("account", "kind", "amount_micro", "placement_id", "region")
PLACEMENT_FIELDS = ("minion_id", "node_owner", "region")  # written once, with the placement
SERIES_LABELS: dict[str, tuple[str, ...]] = {
    "spent": ("account",),
    "earned": ("account", "node", "region"),
    "node_cost": ("node", "region", "owner"),
}


@dataclass(frozen=True)
class TotalRow:
    """One series' sum for one set of labels (in SERIES_LABELS' order), in micro-credits."""

    series: str
    labels: tuple[str, ...]
    micro: int

    @property
    def key(self) -> str:
        return json.dumps([self.series, *self.labels])


@dataclass
class LedgerTotals:
    spent: Counter[str] = field(default_factory=Counter)  # account -> micro
    earned: Counter[tuple[str, str, str]] = field(default_factory=Counter)  # account, node, region
    node_cost: Counter[tuple[str, str, str]] = field(default_factory=Counter)  # node, region, owner

    def add(self, other: LedgerTotals) -> None:
        """Add `other`'s sums (zero and negative ones kept, which `Counter.__add__` drops)."""
        self.spent.update(other.spent)
        self.earned.update(other.earned)
        self.node_cost.update(other.node_cost)

    def rows(self) -> list[TotalRow]:
        out = [TotalRow("spent", (a,), m) for a, m in self.spent.items()]
        out += [TotalRow("earned", k, m) for k, m in self.earned.items()]
        out += [TotalRow("node_cost", k, m) for k, m in self.node_cost.items()]
        return out

    @classmethod
    def from_rows(cls, rows: Iterable[TotalRow]) -> LedgerTotals:
        out = cls()
        for r in rows:
            if r.series == "spent":
                out.spent[r.labels[0]] += r.micro
            elif r.series == "earned":
                out.earned[(r.labels[0], r.labels[1], r.labels[2])] += r.micro
            elif r.series == "node_cost":
                out.node_cost[(r.labels[0], r.labels[1], r.labels[2])] += r.micro
        return out


def ledger_totals(entries: Iterable[Doc], placements: Mapping[str, Doc]) -> LedgerTotals:
    """Spent: an account's own entries but payouts, negated (a correction's refund lowers it).
    Earned: an earnings sub-account's entries but payouts, by the run's node. Node cost: the
    payers' side of the runs' usage and market charges, by node and its owner. The platform
    account counts in none. A zero entry still names its series (at zero)."""
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
