"""The billing service against the real embedded database, driven by a fake clock."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from gpufleet_billing.periods import to_ms
from gpufleet_billing.queries import Queries
from gpufleet_billing.service import MAX_HOURS_PER_TICK
from gpufleet_contracts.jobs import WorkerState
from gpufleet_contracts.providers import PaymentMode, ProviderEnabled, ProviderKind
from gpufleet_devstack import EmbeddedMongo

from .test_billing_support import (
    HOUR,
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


async def test_market_run_earns_the_a100_example_each_hour_and_the_rest_at_stop(
    mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    clock = FakeClock(T0)
    billing, store = await billing_on(mongo_server.url, db_prefix, clock)
    await billing.worker_placed(placed("p1"))
    await billing.worker_started(started("p1"))
    assert await billing.tick(T0 + 59 * timedelta(minutes=1)) == 0  # no full hour yet
    assert await billing.tick(T0 + HOUR) == 3  # buyer, earnings, platform
    # R-BILL-4: A100 at 2.78, the owner earns (2.78 - 0.25) / 2 = 1.265 per GPU-hour.
    assert await balances(store) == {
        "buyer": -2_780_000,
        "earnings:seller": 1_265_000,
        "platform": 1_515_000,
    }
    assert await billing.tick(T0 + HOUR + timedelta(minutes=30)) == 0
    assert await billing.tick(T0 + HOUR) == 0  # a repeated tick
    # Stop after 2.5 h: the remainder (1.5 h) is settled once, redelivery or not.
    assert await billing.worker_finished(finished("p1", T0 + 2.5 * HOUR)) == 3
    assert await billing.worker_finished(finished("p1", T0 + 2.5 * HOUR)) == 0
    assert await billing.tick(T0 + 5 * HOUR) == 0  # ended: the clock bills nothing more
    assert await balances(store) == {
        "buyer": -6_950_000,
        "earnings:seller": 3_162_500,
        "platform": 3_787_500,
    }
    keys = sorted([e["key"] async for e in store.db.ledger.find({"account": "buyer"})])
    assert keys == ["market:p1:end:buyer", "market:p1:h1:buyer"]
    cost = await Queries(store.db).job_cost("job-p1", "buyer")
    assert cost.cost == "6.950000" and cost.by_kind["market_price"].cost_micro == 6_950_000
    await store.close()


async def test_a_cpu_only_run_is_charged_per_cpu_hour_and_shows_in_the_job_cost(
    mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    """R-JOB-2: 8 CPUs at 0.02 per CPU-hour on another account's node, created by another
    account (federated training, R-BILL-2 applies as for GPUs), for 1 h 15 min."""
    clock = FakeClock(T0)
    billing, store = await billing_on(mongo_server.url, db_prefix, clock)
    cpu = placed(
        "c1",
        gpu_model="",
        gpu_indices=[],
        gpu_count=0,
        cpu_count=8,
        rate=Decimal("0.02"),
        creator="guest",
    )
    await billing.worker_placed(cpu)
    await billing.worker_started(started("c1"))
    assert await billing.tick(T0 + HOUR) == 5  # market: 3 entries, federated: 2
    # 8 x 0.02 = 0.16 an hour; the platform keeps 8 x 0.0125 = 0.10 and half of 0.06
    assert await balances(store) == {
        "buyer": -160_000,
        "earnings:seller": 30_000,
        "guest": -2_650_000,
        "platform": 2_780_000,
    }
    assert await billing.worker_finished(finished("c1", T0 + 1.25 * HOUR)) == 5
    assert await balances(store) == {
        "buyer": -200_000,  # 1.25 h x 0.16, exactly
        "earnings:seller": 37_500,
        "guest": -3_312_500,  # 1.25 h x 2.65
        "platform": 3_475_000,
    }
    cost = await Queries(store.db).job_cost("job-c1", "buyer")
    assert cost.cost_micro == 200_000 and set(cost.by_kind) == {"market_price"}
    memos = [e.memo for e in cost.entries]
    assert memos == [
        "8 CPUs at 0.02/CPU-hour, hour 1 on seller's node",
        "8 CPUs at 0.02/CPU-hour, run of 4500.000s on seller's node",
    ]
    await store.close()


async def test_hours_billed_past_a_late_stop_are_corrected_exactly(
    mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    """The agent was down: the clock billed three hours of a run that ended after 90 min."""
    billing, store = await billing_on(mongo_server.url, db_prefix, FakeClock())
    await billing.worker_placed(
        placed(
            "p1", charge="usage", payer="own", node_owner="own", creator="own", rate=Decimal("0.25")
        )
    )
    await billing.worker_started(started("p1"))
    await billing.tick(T0 + 3 * HOUR)
    assert (await balances(store))["own"] == -750_000
    await billing.worker_finished(finished("p1", T0 + 1.5 * HOUR))
    assert await balances(store) == {"own": -375_000, "platform": 375_000}
    await store.close()


async def test_federated_fee_is_charged_to_the_creator_per_hour(
    mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    billing, store = await billing_on(mongo_server.url, db_prefix, FakeClock())
    evt = placed(
        "p1",
        charge="usage",
        payer="owner",
        node_owner="owner",
        creator="guest",
        rate=Decimal("0.25"),
        job_type="inference",
    )
    await billing.worker_placed(evt)
    await billing.worker_started(started("p1"))
    await billing.tick(T0 + HOUR)
    assert (await balances(store))["guest"] == -1_850_000
    await billing.worker_finished(finished("p1", T0 + 1.5 * HOUR))
    assert await balances(store) == {
        "owner": -375_000,  # usage fee: 1.5 h x 0.25 (R-BILL-1, the project owner)
        "guest": -2_775_000,  # federated: 1.5 h x 1.85 (R-BILL-2, the creator)
        "platform": 3_150_000,
    }
    await store.close()


async def test_device_fees_are_charged_daily_catch_up_and_correct_late_events(
    mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    day = datetime(2025, 6, 9, tzinfo=UTC)  # June: 30 days
    clock = FakeClock(day)
    billing, store = await billing_on(mongo_server.url, db_prefix, clock)
    for i in range(10):
        await billing.device_added(added(f"d{i}", day + timedelta(hours=1)))
    assert await billing.tick(day + timedelta(hours=23)) == 0  # the day is not over
    assert await billing.tick(day + timedelta(days=1, minutes=1)) == 2
    assert (await balances(store))["acme"] == -5_000_000
    # Service down for three days: on restart the missed days are charged, once each.
    billing2, store2 = await billing_on(mongo_server.url, db_prefix, clock)
    await billing2.tick(day + timedelta(days=4, minutes=1))
    await billing2.tick(day + timedelta(days=4, minutes=2))
    assert (await balances(store2))["acme"] == -20_000_000  # June 9..12
    # A device added on June 11 is reported late: June 11 and 12 are corrected.
    assert await billing2.device_added(added("late", day + timedelta(days=2, hours=5))) == 4
    assert (await balances(store2))["acme"] == -21_000_000
    # Removing 5 on June 13 lowers June 14, not June 13.
    for i in range(5):
        await billing2.device_removed(removed(f"d{i}", day + timedelta(days=4, hours=12)))
    await billing2.tick(day + timedelta(days=6, minutes=1))
    fees = {
        e["day"]: e["amount_micro"]
        async for e in store2.db.ledger.find({"account": "acme", "stage": "r0"})
    }
    assert fees["2025-06-13"] == -5_500_000 and fees["2025-06-14"] == -3_000_000
    assert sum((await balances(store2)).values()) == 0
    await store.close()
    await store2.close()


async def test_credits_mode_pays_earnings_into_the_billing_account_daily(
    mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    clock = FakeClock(T0)
    billing, store = await billing_on(mongo_server.url, db_prefix, clock)
    await billing.provider_enabled(
        ProviderEnabled(
            account="seller",
            provider=ProviderKind.physical,
            payment_mode=PaymentMode.credits,
            at=T0 - timedelta(days=1),
        )
    )
    await billing.provider_enabled(
        ProviderEnabled(
            account="buyer",
            provider=ProviderKind.gcp,
            payment_mode=PaymentMode.stripe,
            at=T0 - timedelta(days=1),
        )
    )
    await billing.worker_placed(placed("p1"))
    await billing.worker_finished(finished("p1", T0 + 2 * HOUR))
    next_day = datetime(2025, 6, 3, 0, 1, tzinfo=UTC)
    assert await billing.tick(next_day) == 2
    assert await billing.tick(next_day + HOUR) == 0
    q = Queries(store.db)
    seller = await q.balance("seller")
    assert seller.balance_micro == 2_530_000 and seller.earnings_unpaid_micro == 0
    earnings = await q.earnings("seller", None, None)
    assert earnings.earned_micro == 2_530_000 and earnings.paid_out_micro == 2_530_000
    assert [n.model_dump() for n in earnings.by_node] == [
        {"node_id": "node-a", "region": "east", "earned": "2.530000", "earned_micro": 2_530_000}
    ]
    assert earnings.by_region[0].region == "east"
    in_june_1 = await q.earnings("seller", None, 1748822400000)  # before 2025-06-02
    assert in_june_1.earned_micro == 0
    assert (await q.balance("buyer")).balance_micro == -5_560_000
    await store.close()


async def test_the_readme_worked_example(mongo_server: EmbeddedMongo, db_prefix: str) -> None:
    """services/billing/README.md, 'Worked example', entry for entry."""
    billing, store = await billing_on(mongo_server.url, db_prefix, FakeClock())
    await billing.provider_enabled(
        ProviderEnabled(
            account="seller",
            provider=ProviderKind.physical,
            payment_mode=PaymentMode.credits,
            at=T0 - timedelta(days=1),
        )
    )
    for i in range(10):
        await billing.device_added(added(f"d{i}", T0 - timedelta(days=1), account="seller"))
    await billing.worker_placed(placed("p", creator="guest", job_type="training"))
    await billing.worker_started(started("p"))
    await billing.tick(T0 + HOUR)
    await billing.tick(T0 + 2 * HOUR)
    await billing.worker_finished(finished("p", T0 + 2.5 * HOUR))
    await billing.tick(datetime(2025, 6, 3, 0, 0, 1, tzinfo=UTC))
    got = await balances(store)
    # June 1 (the devices' first day) and June 2 are each 5.00 of device fees.
    assert got == {
        "buyer": -6_950_000,
        "guest": -6_625_000,
        "seller": -10_000_000 + 3_162_500,
        "earnings:seller": 0,
        "platform": 3_787_500 + 6_625_000 + 10_000_000,
    }
    end = {e["key"]: e["amount_micro"] async for e in store.db.ledger.find({"stage": "end"})}
    assert end["market:p:end:buyer"] == -1_390_000
    assert end["market:p:end:earnings:seller"] == 632_500
    assert end["federated:p:end:guest"] == -1_325_000
    await store.close()


async def test_a_node_cannot_bill_time_before_the_placement_or_after_its_reports(
    mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    """H2: the node's claimed times are clamped to [placed_at, received] (start) and
    [start, received] (end), received being the stream's timestamp of the event."""
    clock = FakeClock(T0)
    billing, store = await billing_on(mongo_server.url, db_prefix, clock)
    ten_years = timedelta(days=3650)
    await billing.worker_placed(placed("p1"))
    await billing.worker_started(started("p1", T0 - ten_years), received_at=T0 + HOUR)
    p = await store.db.placements.find_one({"_id": "p1"})
    assert p is not None and p["started_ms"] == to_ms(T0)  # not before the placement
    # The finish claims a far-past start and a far-future end; received 2 h after placement.
    fin = finished("p1", T0 + ten_years, start=T0 - ten_years)
    assert await billing.worker_finished(fin, received_at=T0 + 2 * HOUR) == 3
    assert (await balances(store))["buyer"] == -2 * 2_780_000  # 2 h, not ten years

    # A start claimed after its event was received is brought back to the receipt.
    await billing.worker_placed(placed("p2"))
    await billing.worker_started(started("p2", T0 + ten_years), received_at=T0 + HOUR)
    p = await store.db.placements.find_one({"_id": "p2"})
    assert p is not None and p["started_ms"] == to_ms(T0 + HOUR)
    # An end before the start is the start: a zero-length run.
    await billing.worker_finished(finished("p2", T0, start=None), received_at=T0 + 2 * HOUR)
    p = await store.db.placements.find_one({"_id": "p2"})
    assert p is not None and p["ended_ms"] == p["started_ms"]
    await store.close()


async def test_the_clock_bills_a_long_backlog_a_bounded_number_of_hours_per_tick(
    mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    clock = FakeClock(T0)
    billing, store = await billing_on(mongo_server.url, db_prefix, clock)
    await billing.worker_placed(placed("p1"))
    await billing.worker_started(started("p1"))
    later = T0 + 100 * HOUR
    assert await billing.tick(later) == 3 * MAX_HOURS_PER_TICK
    p = await store.db.placements.find_one({"_id": "p1"})
    assert p is not None and p["hours_billed"] == MAX_HOURS_PER_TICK
    for _ in range(5):
        await billing.tick(later)
    assert (await balances(store))["buyer"] == -100 * 2_780_000  # caught up, no more
    await store.close()


async def test_a_fact_before_its_placement_is_parked_and_applied_when_it_arrives(
    mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    """Never refused, never retried: kept until the placement is recorded (service.py says
    when a fact can precede its placement at all), then applied once, from its node only."""
    billing, store = await billing_on(mongo_server.url, db_prefix, FakeClock(T0))
    await billing.worker_started(started("p1"), received_at=T0 + HOUR)
    assert await billing.worker_finished(finished("p1", T0 + 2 * HOUR)) == 0
    assert await billing.worker_finished(finished("p1", T0 + 2 * HOUR)) == 0  # a redelivery
    assert await store.db.parked.count_documents({}) == 2
    assert await balances(store) == {}
    await billing.worker_placed(placed("p1"))
    assert await store.db.parked.count_documents({}) == 0
    assert (await balances(store))["buyer"] == -2 * 2_780_000
    await billing.worker_placed(placed("p1"))  # a redelivery of the placement: nothing more
    assert (await balances(store))["buyer"] == -2 * 2_780_000
    # A parked fact from another node than the placement's is dropped when applied.
    await billing.worker_started(started("p2").model_copy(update={"minion_id": "m-other"}))
    await billing.worker_placed(placed("p2"))
    p = await store.db.placements.find_one({"_id": "p2"})
    assert p is not None and "started_ms" not in p
    assert await store.db.parked.count_documents({}) == 0
    await store.close()


async def test_a_void_placement_is_billed_up_to_its_loss_and_never_after(
    mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    """Its node declared lost, the scheduler closes the run at the loss (its own
    WorkerFinished `failed`) and requeues the worker; the node, alive after all, reports the
    old run late: its start and its end change nothing (issue 15: the overlap of the old run
    and the new one is never charged)."""
    billing, store = await billing_on(mongo_server.url, db_prefix, FakeClock(T0))
    await billing.worker_placed(placed("p1"))
    await billing.worker_started(started("p1"))
    lost = finished("p1", T0 + HOUR).model_copy(
        update={"state": WorkerState.failed, "exit_code": None, "reason": "node m-a lost"}
    )
    assert await billing.worker_finished(lost) == 3
    assert await billing.worker_finished(finished("p1", T0 + 3 * HOUR)) == 0  # the node's, late
    assert (await balances(store))["buyer"] == -2_780_000  # one hour, to the loss
    # Closed before its start was recorded: a start reported after that bills nothing.
    await billing.worker_placed(placed("p2"))
    unstarted = {"placement_id": "p2", "job_id": "job-p2", "started_at": None}
    assert await billing.worker_finished(lost.model_copy(update=unstarted)) == 0
    await billing.worker_started(started("p2"))
    assert await billing.tick(T0 + 5 * HOUR) == 0
    assert await billing.worker_finished(finished("p2", T0 + 3 * HOUR)) == 0
    p = await store.db.placements.find_one({"_id": "p2"})
    assert p is not None and "started_ms" not in p
    assert (await balances(store))["buyer"] == -2_780_000
    await store.close()
