"""Property tests of the ledger rules on plain data (thousands of generated sequences).

A small in-memory ledger replays the service's algorithm with the real pure functions
(`worker_targets`, `settle.delta`, `devices_charged`): random clock ticks, late, duplicated
and reordered events. Whatever the order, every stage balances, no key is written twice, and
each group ends at exactly the amount its facts call for.
"""

from __future__ import annotations

from datetime import date, timedelta
from decimal import Decimal
from typing import Any

from gpufleet_billing.device_fees import DeviceSpan, day_fee_micro, devices_charged
from gpufleet_billing.fees import MS_PER_HOUR, Posting
from gpufleet_billing.periods import day_bounds_ms, day_of, days
from gpufleet_billing.placements import worker_targets
from gpufleet_billing.settle import Posted, by_account, delta, entry_key, next_revision
from hypothesis import given, settings
from hypothesis import strategies as st

MODELS = ["RTX 3090", "RTX A6000", "A100 80GB", "T4"]


class MemLedger:
    def __init__(self) -> None:
        self.entries: dict[str, tuple[str, str, Posting]] = {}  # key -> (group, stage, posting)

    def posted(self, group: str) -> list[Posted]:
        return [
            Posted(p.account, p.amount_micro, stage, p.kind)
            for g, stage, p in self.entries.values()
            if g == group
        ]

    def write(self, group: str, stage: str, postings: list[Posting]) -> None:
        assert sum(p.amount_micro for p in postings) == 0
        for p in postings:
            key = entry_key(group, stage, p.account)
            assert key not in self.entries, f"{key} written twice"
            self.entries[key] = (group, stage, p)

    def balances(self) -> dict[str, int]:
        return by_account(p for _, _, p in self.entries.values())


@st.composite
def placements(draw: Any) -> dict[str, Any]:
    return {
        "_id": "p1",
        "charge": draw(st.sampled_from(["usage", "market"])),
        "payer": "owner",
        "node_owner": draw(st.sampled_from(["owner", "seller"])),
        "creator": draw(st.sampled_from(["owner", "guest", ""])),
        "job_type": draw(st.sampled_from(["training", "inference", "endpoint", "notebook"])),
        "gpu_model": draw(st.sampled_from(MODELS)),
        "gpu_count": draw(st.integers(1, 8)),
        "rate": str(Decimal(draw(st.integers(0, 5_000_000))) / 1_000_000),
    }


@settings(max_examples=3000, deadline=None)
@given(
    p=placements(),
    duration=st.integers(0, 5 * MS_PER_HOUR),
    ticks=st.lists(st.integers(0, 8 * MS_PER_HOUR), max_size=12),
    finish_at=st.integers(0, 12),
    dup_at=st.integers(0, 12),
)
def test_a_run_is_billed_exactly_once_whatever_the_clock_saw(
    p: dict[str, Any], duration: int, ticks: list[int], finish_at: int, dup_at: int
) -> None:
    """Hourly ticks (even past the real end: a late WorkerFinished) plus settlement at stop
    always add up to the run's exact total, in balanced stages, without a repeated key."""
    ledger = MemLedger()
    state = {"hours": 0, "ended": False}
    steps: list[int | None] = sorted(ticks)
    steps.insert(min(finish_at, len(steps)), None)
    steps.insert(min(dup_at, len(steps)), None)  # a redelivered WorkerFinished
    for step in steps:
        if state["ended"]:
            continue
        if step is None:
            state["ended"] = True
            for group, target in worker_targets(p, duration):
                ledger.write(group, "end", delta(target, ledger.posted(group)))
            continue
        for k in range(state["hours"] + 1, step // MS_PER_HOUR + 1):
            state["hours"] = k
            for group, target in worker_targets(p, k * MS_PER_HOUR):
                ledger.write(group, f"h{k}", delta(target, ledger.posted(group)))
    expected = by_account(posting for _, ps in worker_targets(p, duration) for posting in ps)
    got = ledger.balances()
    assert {a: v for a, v in got.items() if v} == {a: v for a, v in expected.items() if v}
    assert sum(got.values()) == 0


MONTH0 = date(2024, 1, 20)  # a window across January (31), February (29 in 2024), March


@st.composite
def device_histories(draw: Any) -> tuple[list[tuple[str, str, int]], list[int]]:
    """Device events (kind, id, ms) and the clock's days (offsets) at which ticks happen."""
    start, _ = day_bounds_ms(MONTH0)
    events: list[tuple[str, str, int]] = []
    for i in range(draw(st.integers(1, 6))):
        added = start + draw(st.integers(0, 40 * 86_400_000))
        events.append(("add", f"d{i}", added))
        if draw(st.booleans()):
            events.append(("remove", f"d{i}", added + draw(st.integers(0, 20 * 86_400_000))))
    dups = draw(st.lists(st.sampled_from(events), max_size=4))
    order = draw(st.permutations(events + dups))
    ticks = draw(st.lists(st.integers(0, 70), min_size=1, max_size=8))
    return list(order), sorted(ticks)


@settings(max_examples=1500, deadline=None)
@given(history=device_histories(), interleave=st.lists(st.integers(0, 20), max_size=12))
def test_device_fees_reach_the_same_days_whatever_the_order(
    history: tuple[list[tuple[str, str, int]], list[int]], interleave: list[int]
) -> None:
    events, ticks = history
    ledger = MemLedger()
    spans: dict[str, dict[str, int]] = {}
    cursor: list[date] = []

    def settleday_of(d: date) -> None:
        live = [
            DeviceSpan(k, v["added"], v.get("removed")) for k, v in spans.items() if "added" in v
        ]
        count = devices_charged(live, d)
        target = (
            [
                Posting("acme", -day_fee_micro(count, d), "device_fee"),
                Posting("platform", day_fee_micro(count, d), "device_fee"),
            ]
            if count
            else []
        )
        group = f"devicefee:acme:{d}"
        have = ledger.posted(group)
        ledger.write(group, next_revision(have), delta(target, have))

    def apply(kind: str, device: str, ms: int) -> None:
        field = "added" if kind == "add" else "removed"
        doc = spans.setdefault(device, {})
        if field in doc and doc[field] <= ms:
            return
        doc[field] = ms
        if cursor:
            first = day_of(ms)
            for d in days(first, cursor[0]):
                settleday_of(d)

    def tick(today: date) -> None:
        live = [v["added"] for v in spans.values() if "added" in v]
        if not live:
            return
        first = cursor[0] if cursor else min(day_of(a) for a in live)
        for d in days(first, today):
            settleday_of(d)
        if first < today:
            cursor[:] = [today]

    # Events and ticks interleave in a random way; the clock only moves forward.
    queue = list(events)
    for t in ticks:
        for _ in range(interleave.pop() if interleave else 1):
            if queue:
                apply(*queue.pop(0))
        tick(MONTH0 + timedelta(days=t))
    for e in queue:
        apply(*e)
    final = MONTH0 + timedelta(days=80)
    tick(final)

    live = [DeviceSpan(k, v["added"], v.get("removed")) for k, v in spans.items() if "added" in v]
    expected = sum(
        day_fee_micro(devices_charged(live, d), d)
        for d in days(min(day_of(s.added_ms) for s in live), final)
    )
    assert ledger.balances().get("acme", 0) == -expected
    assert sum(ledger.balances().values()) == 0
