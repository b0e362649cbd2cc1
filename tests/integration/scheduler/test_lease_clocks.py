"""The scheduler's lease under clocks that disagree or jump (issue 16).

Each instance gets its own clock (`now_ms`); they advance together, at one rate, but read
an hour apart, as two hosts whose wall clocks disagree (or one stepped). Expiry must not
depend on the readings, only on time passing: a live leader keeps its lease, a dead one's
is taken one TTL later, and never do two instances both believe they lead."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from gpufleet_bus import Ports
from gpufleet_contracts.clock import offset_clock
from gpufleet_devstack import EmbeddedMongo, NatsServer, wait_for_async
from gpufleet_scheduler.app import build_app
from gpufleet_scheduler.leadership import Deposed, Lease

from ..conftest import broker_for, running, store_for
from .test_fleet import Sys, known, registered

HOUR = 3_600_000
TTL = 10_000


class Clocks:
    """One time passing; each instance reads it with its own offset (a step: change it)."""

    def __init__(self) -> None:
        self.t = 1_000_000_000
        self.offset: dict[str, int] = {}

    def of(self, name: str, offset: int = 0) -> Callable[[], int]:
        self.offset[name] = offset
        return lambda: self.t + self.offset[name]

    def pass_ms(self, ms: int) -> None:
        self.t += ms


def two(store: Any, clocks: Clocks, a_off: int, b_off: int) -> tuple[Lease, Lease]:
    a = Lease(store.db, ttl_ms=TTL, owner="a", now_ms=clocks.of("a", a_off))
    b = Lease(store.db, ttl_ms=TTL, owner="b", now_ms=clocks.of("b", b_off))
    return a, b


@pytest.mark.parametrize("skew", [HOUR, -HOUR], ids=["standby-ahead", "standby-behind"])
async def test_a_live_leader_keeps_its_lease_whatever_the_standbys_clock(
    mongo_server: EmbeddedMongo, db_prefix: str, skew: int
) -> None:
    store = store_for("scheduler", mongo_server.url, db_prefix)
    clocks = Clocks()
    a, b = two(store, clocks, 0, skew)
    assert await a.acquire()
    for _ in range(12):  # two minutes: a renews every TTL/3, b keeps trying
        clocks.pass_ms(TTL // 3)
        assert await a.acquire() and a.epoch == 1
        assert not await b.acquire(), "the standby took a live leader's lease"
        assert a.held and not b.held
    await store.close()


@pytest.mark.parametrize("step", [HOUR, -HOUR], ids=["forward", "back"])
async def test_a_leader_whose_clock_steps_keeps_its_lease_and_when_dead_loses_it_in_a_ttl(
    mongo_server: EmbeddedMongo, db_prefix: str, step: int
) -> None:
    store = store_for("scheduler", mongo_server.url, db_prefix)
    clocks = Clocks()
    a, b = two(store, clocks, 0, 0)
    assert await a.acquire() and not await b.acquire()
    clocks.offset["a"] += step  # a's clock is stepped an hour
    for _ in range(6):
        clocks.pass_ms(TTL // 3)
        assert await a.acquire() and a.epoch == 1, "the leader lost its lease for no reason"
        assert not await b.acquire()
    # a dies without releasing: b takes over one TTL after it last saw a renewal, not an hour
    waited = 0
    while not await b.acquire():
        clocks.pass_ms(1000)
        waited += 1000
        assert waited <= 2 * TTL, "a dead leader's lease outlived it"
    assert b.epoch == 2 and not a.held

    async def fenced(tx: Any) -> None:
        await a.fence(tx.session)

    with pytest.raises(Deposed):
        await store.transaction(fenced)
    await store.close()


@pytest.mark.parametrize("skew", [HOUR, -HOUR, 0], ids=["ahead", "behind", "same"])
async def test_two_instances_never_both_believe_they_lead(
    mongo_server: EmbeddedMongo, db_prefix: str, skew: int
) -> None:
    """a stops renewing (a long pause, not dead); b takes over when it may. At every step
    at most one of them believes it leads."""
    store = store_for("scheduler", mongo_server.url, db_prefix)
    clocks = Clocks()
    a, b = two(store, clocks, skew, 0)
    assert await a.acquire()
    took = False
    for _ in range(40):
        clocks.pass_ms(500)
        took = await b.acquire() or took
        assert not (a.held and b.held), "two instances believe they lead"
    assert took and b.epoch == 2
    # a wakes up: it learns it was deposed and does not take the lease back
    assert not await a.acquire() and not a.held and b.held
    await store.close()


async def test_a_lease_written_by_an_older_version_is_taken_one_ttl_after_it_was_seen(
    mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    """The document an older version wrote (a wall-clock `expires_ms`, no renewal count):
    its far-future expiry is not believed; a released one (expires 0) is free at once."""
    store = store_for("scheduler", mongo_server.url, db_prefix)
    clocks = Clocks()
    old = {"_id": "scheduler", "owner": "old", "epoch": 4, "expires_ms": 10**15}
    await store.db.leases.insert_one(old)
    b = Lease(store.db, ttl_ms=TTL, owner="b", now_ms=clocks.of("b"))
    assert not await b.acquire()
    clocks.pass_ms(TTL)
    assert await b.acquire() and b.epoch == 5
    await b.release()
    await store.db.leases.replace_one({"_id": "scheduler"}, old | {"expires_ms": 0})
    c = Lease(store.db, ttl_ms=TTL, owner="c", now_ms=clocks.of("c"))
    assert await c.acquire() and c.epoch == 5
    await store.close()


async def test_two_scheduler_processes_two_hours_apart_keep_one_leader(
    fresh_nats: NatsServer,
    mongo_server: EmbeddedMongo,
    db_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two whole schedulers, their clocks an hour ahead and an hour behind (as
    `GPUFLEET_CLOCK_OFFSET_S` gives them), a lease of 1 s: over many terms the first leader
    keeps it (epoch 1), both place through it, and every claim carries that epoch."""
    monkeypatch.setenv("GPUFLEET_LEASE_TTL_S", "1")

    def make(name: str, offset_s: float) -> Any:
        monkeypatch.setenv("GPUFLEET_SCHEDULER_INSTANCE", name)
        built = build_app(
            Ports(
                broker_for("scheduler", fresh_nats),
                store_for("scheduler", mongo_server.url, db_prefix),
                clock=offset_clock(offset_s),
            )
        )
        return built.app, built.core

    apps = [make("ahead", 3600), make("behind", -3600)]
    async with running(*(a for a, _ in apps)):
        s = Sys(fresh_nats, apps[0][1])
        await s.node(registered("a", gpus=4))
        await known(s, "a")
        jobs = []
        for i in range(4):  # four terms of the lease, a submission in each
            jobs.append(await s.submit(f"j{i}"))
            await asyncio.gather(*(sched.passes.schedule() for _, sched in apps))
            await asyncio.sleep(1.0)
            leaders = [sched for _, sched in apps if sched.state.lease.held]
            assert len(leaders) <= 1

        async def four_placed() -> bool:
            return bool(await s.sched.state.db.claims.count_documents({}) == 4)

        await wait_for_async(four_placed, timeout=15)
        lease = await s.sched.state.db.leases.find_one({"_id": "scheduler"})
        assert lease is not None and lease["epoch"] == 1, "the lease changed hands"
        claims = await s.sched.state.db.claims.find({}).to_list(None)
        assert {c.get("epoch") for c in claims} == {1}
        await s.close()
