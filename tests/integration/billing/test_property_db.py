"""The property test against the real embedded database (fewer examples: one database each).

Random histories of worker and device events, with duplicates, any order (a worker fact
before its placement is parked and applied when the placement arrives) and clock ticks in between,
end with the balances the rules give on the facts alone; each balance is its entries' sum.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from decimal import Decimal
from typing import Any

from gpufleet_billing.device_fees import DeviceSpan, day_fee_micro, devices_charged
from gpufleet_billing.periods import day_of, days, to_ms
from gpufleet_billing.placements import worker_targets
from gpufleet_billing.queries import Queries
from gpufleet_billing.settle import by_account
from gpufleet_devstack import EmbeddedMongo
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .test_billing_support import (
    T0,
    FakeClock,
    added,
    balances,
    billing_on,
    finished,
    placed,
    removed,
    started,
)

END = T0 + timedelta(days=4)


@st.composite
def histories(draw: Any) -> dict[str, Any]:
    runs = []
    for i in range(draw(st.integers(1, 3))):
        begin = T0 + timedelta(minutes=draw(st.integers(0, 24 * 60)))
        length = timedelta(minutes=draw(st.integers(0, 5 * 60)))
        kw = {
            "charge": draw(st.sampled_from(["usage", "market"])),
            "creator": draw(st.sampled_from(["buyer", "guest"])),
            "rate": Decimal(draw(st.integers(0, 4000))) / 1000,
            "gpu_count": draw(st.integers(1, 4)),
        }
        runs.append((f"p{i}", begin, begin + length, kw))
    devices = []
    for i in range(draw(st.integers(0, 3))):
        at = T0 + timedelta(hours=draw(st.integers(0, 60)))
        gone = at + timedelta(hours=draw(st.integers(0, 40))) if draw(st.booleans()) else None
        devices.append((f"d{i}", at, gone))
    return {
        "runs": runs,
        "devices": devices,
        "seed": draw(st.randoms()),
        "ticks": draw(st.lists(st.integers(0, 96 * 60), max_size=5)),
    }


def expected(h: dict[str, Any]) -> dict[str, int]:
    postings = []
    for pid, begin, end, kw in h["runs"]:
        p = placed(pid, **kw).model_dump() | {"_id": pid, "rate": str(kw["rate"])}
        p["job_type"] = "training"
        for _, target in worker_targets(p, to_ms(end) - to_ms(begin)):
            postings += target
    out = by_account(postings)
    spans = [DeviceSpan(d, to_ms(a), to_ms(r) if r else None) for d, a, r in h["devices"]]
    if spans:
        fee = sum(
            day_fee_micro(devices_charged(spans, d), d)
            for d in days(min(day_of(s.added_ms) for s in spans), END.date())
        )
        out["acme"] = out.get("acme", 0) - fee
        out["platform"] = out.get("platform", 0) + fee
    return {k: v for k, v in out.items() if v}


async def replay(url: str, h: dict[str, Any]) -> None:
    events: list[Any] = []
    for pid, begin, end, kw in h["runs"]:
        events += [placed(pid, **kw), started(pid, begin), finished(pid, end, start=begin)]
    for d, at, gone in h["devices"]:
        events.append(added(d, at))
        if gone:
            events.append(removed(d, gone))
    rnd = h["seed"]
    events += rnd.sample(events, k=min(3, len(events)))  # redeliveries
    rnd.shuffle(events)
    steps: list[Any] = events + [T0 + timedelta(minutes=t) for t in sorted(h["ticks"])]
    rnd.shuffle(steps)
    ticks = sorted(s for s in steps if not hasattr(s, "TYPE"))  # the clock only moves forward
    steps = [s if hasattr(s, "TYPE") else ticks.pop(0) for s in steps]

    billing, store = await billing_on(url, f"t{uuid.uuid4().hex[:8]}", FakeClock(END))
    handlers: dict[str, Callable[[Any], Awaitable[object]]] = {
        "WorkerPlaced": billing.worker_placed,
        "WorkerStarted": billing.worker_started,
        "WorkerFinished": billing.worker_finished,
        "DeviceAdded": billing.device_added,
        "DeviceRemoved": billing.device_removed,
    }
    while steps:
        step = steps.pop(0)
        if not hasattr(step, "TYPE"):
            await billing.tick(step)
            continue
        await handlers[type(step).__name__](step)  # never refused: a fact waits for its placement
    await billing.tick(END)
    got = {k: v for k, v in (await balances(store)).items() if v}
    want = expected(h)
    assert got == want
    q = Queries(store.db)
    for account in got:
        assert (await q.balance(account)).balance_micro == got[account]
    await store.client.drop_database(store.db.name)
    await store.close()


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(h=histories())
def test_random_histories_reach_the_rules_balances(
    mongo_server: EmbeddedMongo, h: dict[str, Any]
) -> None:
    asyncio.run(replay(mongo_server.url, h))
