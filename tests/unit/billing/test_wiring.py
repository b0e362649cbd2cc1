"""Billing's wiring table: one ordered consumer for the worker stream, dispatched by type."""

from __future__ import annotations

from typing import Any, cast

from gpufleet_billing.app import BillingSettings, build_app
from gpufleet_bus import BusSettings, Ports, make_broker
from gpufleet_contracts import subjects
from gpufleet_contracts.billing import EntriesQuery
from gpufleet_contracts.jobs import WorkerFinished, WorkerPlaced, WorkerStarted, WorkerUploading
from gpufleet_store import Store, StoreSettings


def test_the_worker_stream_is_one_consumer_dispatching_by_type() -> None:
    broker = make_broker("billing", BusSettings(nats_url="nats://127.0.0.1:1"))
    store = Store.connect("billing", StoreSettings(mongo_url="mongodb://127.0.0.1:1"))
    svc = build_app(Ports(broker, store), BillingSettings(tick_s=0))
    events = {w.message: w.handler for w in svc.runtime.table if w.kind == "event"}
    for model in (WorkerPlaced, WorkerStarted, WorkerUploading, WorkerFinished):
        assert events[model.__name__].endswith("Handlers.worker_events")
    consumers = sorted(cast(Any, s).config.durable_name for s in broker.subscribers)
    assert consumers == [
        "billing-device-added",
        "billing-device-removed",
        "billing-provider-enabled",
    ]
    # One consumer for the worker stream (subjects.WORKER_EVENTS), a batch at a time: the
    # stream's order is the order applied.
    (worker_events,) = svc.runtime.batches
    assert worker_events.durable == "billing-worker-events"
    assert worker_events.subject == subjects.WORKER_EVENTS
    assert {m.TYPE for m in worker_events.spec.types} == {
        WorkerPlaced.TYPE,
        WorkerStarted.TYPE,
        WorkerUploading.TYPE,  # kept by the scheduler on the same tree; changes nothing here
        WorkerFinished.TYPE,
    }
    requests = sorted(w.subject.split(".")[4] for w in svc.runtime.table if w.kind == "request")
    assert requests == [
        "balance",
        "dead_letters",
        "earnings",
        "entries",
        "health",
        "job_cost",
        "series",
    ]


async def test_the_clock_s_settlements_stop_when_its_periodic_job_stops() -> None:
    """Every.stop waits for the round in hand; the round stops between settlements."""
    broker = make_broker("billing", BusSettings(nats_url="nats://127.0.0.1:1"))
    store = Store.connect("billing", StoreSettings(mongo_url="mongodb://127.0.0.1:1"))
    svc = build_app(Ports(broker, store), BillingSettings(tick_s=3600))
    (clock,) = svc.runtime._every
    assert clock.name == "billing-clock" and clock.grace_s == 10
    assert not svc.core.stopping
    await clock.stop()
    assert svc.core.stopping


def test_the_range_of_a_query_is_read_from_from() -> None:
    """The CLI sends `from` (a Python keyword: the field is `from_`)."""
    q = EntriesQuery.model_validate({"from": "2025-06-01", "limit": 5})
    assert (q.from_, q.to, q.limit) == ("2025-06-01", None, 5)
