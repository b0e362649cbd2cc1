"""The series' rules as increments: a ledger's totals are the sum of its batches' totals,
whatever the split, and survive the rows they are stored as."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

from gpufleet_billing.totals import LedgerTotals, TotalRow, ledger_totals
from hypothesis import given, settings
from hypothesis import strategies as st

PLACEMENTS = {
    "p1": {"minion_id": "m-1", "node_owner": "olga", "region": "eu"},
    "p2": {"minion_id": "m-2", "node_owner": "bob", "region": "us"},
}

entry = st.fixed_dictionaries(
    {
        "account": st.sampled_from(["bob", "olga", "earnings:olga", "earnings:bob", "platform"]),
        "kind": st.sampled_from(
            ["usage_fee", "market_price", "earning", "platform_share", "device_fee", "payout"]
        ),
        "amount_micro": st.integers(-5_000_000, 5_000_000),
    },
    optional={
        "placement_id": st.sampled_from(["p1", "p2", "p-unknown"]),
        "region": st.sampled_from(["eu", "us", ""]),
    },
)


def batches(entries: list[dict[str, Any]], cuts: list[int]) -> list[list[dict[str, Any]]]:
    bounds = [0, *sorted(c % (len(entries) + 1) for c in cuts), len(entries)]
    return [entries[a:b] for a, b in pairwise(bounds)]


def exact(t: LedgerTotals) -> tuple[dict[Any, int], ...]:
    """As plain dicts: a series at zero differs from none (Counters compare them equal)."""
    return dict(t.spent), dict(t.earned), dict(t.node_cost)


@settings(max_examples=300, deadline=None)
@given(st.lists(entry, max_size=40), st.lists(st.integers(0, 1000), max_size=6))
def test_totals_are_the_sum_of_any_split_into_batches(
    entries: list[dict[str, Any]], cuts: list[int]
) -> None:
    summed = LedgerTotals()
    for batch in batches(entries, cuts):
        summed.add(ledger_totals(batch, PLACEMENTS))
    assert exact(summed) == exact(ledger_totals(entries, PLACEMENTS))
    assert exact(LedgerTotals.from_rows(summed.rows())) == exact(summed)


def test_zero_and_negative_sums_keep_their_series() -> None:
    charge = {"account": "bob", "kind": "market_price", "placement_id": "p1"}
    t = ledger_totals([{**charge, "amount_micro": 0}], PLACEMENTS)
    t.add(ledger_totals([{**charge, "amount_micro": 700}], PLACEMENTS))  # a refund
    assert t.spent == {"bob": -700}
    assert t.node_cost == {("m-1", "eu", "olga"): -700}
    assert TotalRow("spent", ("bob",), -700) in t.rows()


def test_payouts_and_the_platform_add_nothing() -> None:
    t = ledger_totals(
        [
            {"account": "earnings:olga", "kind": "payout", "amount_micro": -5},
            {"account": "olga", "kind": "payout", "amount_micro": 5},
            {"account": "platform", "kind": "device_fee", "amount_micro": 9},
        ],
        PLACEMENTS,
    )
    assert t.rows() == []


def test_a_row_key_tells_series_and_labels_apart() -> None:
    keys = {
        TotalRow("earned", ("a", "b", "c"), 1).key,
        TotalRow("earned", ("a", "b|c", ""), 1).key,
        TotalRow("node_cost", ("a", "b", "c"), 1).key,
        TotalRow("spent", ("a",), 1).key,
    }
    assert len(keys) == 4
