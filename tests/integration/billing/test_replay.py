"""Billing over the real bus: stopped mid-stream and restarted, then rebuilt from nothing by
replaying the whole GPUFLEET_EVENTS stream; both ledgers end with exactly the same balances."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from decimal import Decimal
from typing import Any

from gpufleet_billing import running_totals
from gpufleet_billing.app import BillingSettings, build_app
from gpufleet_bus import Ports
from gpufleet_contracts import Message, envelope_for, subjects
from gpufleet_contracts.jobs import WorkerFinished, WorkerStarted
from gpufleet_contracts.providers import PaymentMode, ProviderEnabled, ProviderKind
from gpufleet_devstack import EmbeddedMongo, NatsServer

from ..conftest import admin_connect, broker_for, running, store_for
from .test_billing_support import (
    HOUR,
    T0,
    FakeClock,
    added,
    balances,
    finished,
    placed,
    removed,
    started,
)

NOW = T0 + timedelta(days=3, hours=1, minutes=7)  # the clock both services read


def history() -> list[Message]:
    day = timedelta(days=1)
    return [
        ProviderEnabled(
            account="seller",
            provider=ProviderKind.physical,
            payment_mode=PaymentMode.credits,
            at=T0 - day,
        ),
        placed("p1"),
        started("p1"),
        finished("p1", T0 + 2.5 * HOUR),
        placed("p2", charge="usage", payer="owner", node_owner="owner", creator="guest",
               gpu_model="RTX 3090", rate=Decimal("0.05"), gpu_count=2),
        finished("p2", T0 + timedelta(minutes=40)),  # before its start: reordered
        started("p2"),
        placed("p3", rate=Decimal("3.1"), gpu_count=2),
        started("p3", T0 + HOUR),  # still running: billed by the clock, hour by hour
        added("d1", T0), added("d2", T0), added("d3", T0 + 2 * HOUR),
        removed("d1", T0 + day),
        added("d4", T0 + 2 * day),
        placed("p4", payer="buyer2", creator="buyer2", rate=Decimal("2.5")),
        started("p4", T0 + day),
        finished("p4", T0 + day + 3 * HOUR + timedelta(seconds=17), start=T0 + day),
        # A fact before its placement (a placement lost to a refused publish, say): parked,
        # then applied when the placement arrives.
        started("p5", T0 + 2 * day),
        placed("p5", payer="buyer3", creator="buyer3", rate=Decimal("1.5")),
        finished("p5", T0 + 2 * day + 2 * HOUR, start=T0 + 2 * day),
        started("ghost"),  # a placement billing never sees: parked, charges nothing
    ]  # fmt: skip


async def publish_all(server: NatsServer, messages: list[Message], dup_every: int = 3) -> None:
    """Publish on JetStream; every `dup_every`-th message twice under a new id (a redelivery
    the stream cannot deduplicate). The history comes from several services and nodes: the
    test writes it as an operator."""
    nc = await admin_connect(server)
    js = nc.jetstream()
    for i, msg in enumerate(messages):
        for _ in range(2 if i % dup_every == 0 else 1):
            env = envelope_for(msg, source="gpufleet/test", id=uuid.uuid4().hex)
            await js.publish(history_subject(msg), msg.to_bytes(), headers=env.headers())
    await nc.close()


def history_subject(msg: Message) -> str:
    """Where the history holds `msg`: a node's report as the scheduler kept it."""
    if isinstance(msg, WorkerStarted | WorkerFinished):
        fact = "started" if isinstance(msg, WorkerStarted) else "finished"
        return subjects.kept(fact, msg.minion_id)
    return msg.subject()


async def settled(store: Any, within_s: float = 60) -> dict[str, int]:
    """Balances once they stop changing (the consumers and the clock are done)."""
    loop = asyncio.get_running_loop()
    deadline, last, same = loop.time() + within_s, None, 0
    while loop.time() < deadline:
        now = await balances(store)
        same = same + 1 if now == last and now else 0
        if same >= 6:
            return now
        last = now
        await asyncio.sleep(0.5)
    raise AssertionError(f"balances never settled: {last}")


def app_on(server: NatsServer, mongo_url: str, prefix: str) -> Any:
    ports = Ports(
        broker_for("billing", server), store_for("billing", mongo_url, prefix), FakeClock(NOW)
    )
    return build_app(ports, BillingSettings(tick_s=0.2)).app


async def test_stop_mid_stream_then_replay_everything_gives_the_same_balances(
    fresh_nats: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    events = history()
    first = app_on(fresh_nats, mongo_server.url, db_prefix)
    async with running(first):
        await publish_all(fresh_nats, events[:9])
        await asyncio.sleep(0.3)
    # Stopped with messages pending; the rest arrives while billing is down.
    await publish_all(fresh_nats, events[9:])
    again = app_on(fresh_nats, mongo_server.url, db_prefix)
    async with running(again):
        original = await settled(store_for("billing", mongo_server.url, db_prefix))

    # Exact amounts of the rules, for a few of them.
    assert original["buyer2"] == -7_511_806  # 3 h 0 min 17 s x 2.5
    assert original["buyer3"] == -3_000_000  # 2 h x 1.5, its start parked for a while
    assert original["guest"] == -1_766_667  # 40 min of federated training at 2.65
    assert original["owner"] == -66_667  # 2 GPUs x 40 min x 0.05
    # p3: 2 x A100 at 3.1 from T0+1h, 72 full hours billed by NOW (T0 + 3 d 1 h 7 min).
    assert original["buyer"] == -(6_950_000 + 72 * 6_200_000)
    assert sum(original.values()) == 0
    assert "earnings:seller" in original  # today's hours are not paid out yet

    # Rebuild on an empty database from the whole event history.
    nc = await admin_connect(fresh_nats)
    js = nc.jetstream()
    for info in await js.consumers_info(subjects.STREAM_EVENTS):
        if info.name.startswith("billing-"):
            await js.delete_consumer(subjects.STREAM_EVENTS, info.name)
    await nc.close()
    rebuilt_prefix = f"{db_prefix}r"
    rebuilt = app_on(fresh_nats, mongo_server.url, rebuilt_prefix)
    async with running(rebuilt):
        replayed = await settled(store_for("billing", mongo_server.url, rebuilt_prefix))
    assert replayed == original
    # /metrics' running sums (built at each start, moved with each insert) are the ledger's
    for prefix in (db_prefix, rebuilt_prefix):
        db = store_for("billing", mongo_server.url, prefix).db
        assert await db[running_totals.TOTALS].count_documents({"_id": running_totals.MARKER})
        summed = await running_totals.read(db)
        assert summed.spent["buyer2"] == 7_511_806
        assert set(summed.rows()) == set((await running_totals.whole_ledger(db)).rows())
