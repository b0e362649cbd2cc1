"""Billing's series: exact sums of the ledger by account, by earning node and by node."""

from __future__ import annotations

from decimal import Decimal

from gpufleet_billing.fees import usage_postings
from gpufleet_billing.metrics import ledger_families
from gpufleet_billing.totals import ledger_totals

PLACEMENTS = {
    "p1": {"minion_id": "m-1", "node_owner": "olga", "region": "eu"},
    "p2": {"minion_id": "m-2", "node_owner": "bob", "region": "us"},
}


def entries(placement: str, postings: list, region: str) -> list[dict[str, object]]:
    return [
        {
            "account": p.account,
            "kind": p.kind,
            "amount_micro": p.amount_micro,
            "placement_id": placement,
            "region": region,
        }
        for p in postings
    ]


def test_sums_are_exact_and_attributed() -> None:
    market = usage_postings(
        charge="market",
        payer="bob",
        node_owner="olga",
        gpu_model="H100 80GB",
        rate=Decimal("2.50"),
        gpu_count=1,
        duration_ms=3_600_000,
    )
    own = usage_postings(
        charge="usage",
        payer="bob",
        node_owner="bob",
        gpu_model="H100 80GB",
        rate=Decimal("0.10"),
        gpu_count=3,
        duration_ms=1_234_567,
    )
    ledger = [
        *entries("p1", market, "eu"),
        *entries("p2", own, "us"),
        {"account": "alice", "kind": "device_fee", "amount_micro": -300_000},
        {"account": "platform", "kind": "device_fee", "amount_micro": 300_000},
        # a payout moves olga's earnings to her account: neither spent nor earned again
        {"account": "earnings:olga", "kind": "payout", "amount_micro": -1},
        {"account": "olga", "kind": "payout", "amount_micro": 1},
        # a correction refunds part of a charge
        {
            "account": "bob",
            "kind": "market_price",
            "amount_micro": 500_000,
            "placement_id": "p1",
            "region": "eu",
        },
    ]
    t = ledger_totals(ledger, PLACEMENTS)
    earning = next(p.amount_micro for p in market if p.kind == "earning")
    own_total = -own[0].amount_micro
    assert t.spent == {"bob": 2_500_000 + own_total - 500_000, "alice": 300_000}
    assert t.earned == {("olga", "m-1", "eu"): earning}
    assert t.node_cost == {("m-1", "eu", "olga"): 2_000_000, ("m-2", "us", "bob"): own_total}
    out = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in ledger_families(t)
        for s in f.samples
    }
    assert out[("gpufleet_account_spent_credits_total", (("account", "alice"),))] == 0.3
    assert (
        out[
            (
                "gpufleet_node_cost_credits_total",
                (("node", "m-1"), ("owner", "olga"), ("region", "eu")),
            )
        ]
        == 2.0
    )
