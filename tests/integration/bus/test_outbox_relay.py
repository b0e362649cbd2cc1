"""The outbox relay against a real nats-server and nx-27017: one document per transaction,
published in order with async publish, retried whole on any failure, never doubled."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from faststream.nats import NatsBroker
from gpufleet_bus import OutboxRelay, ensure_streams
from gpufleet_bus import outbox as outbox_module
from gpufleet_bus.outbox import OutboxPublishError
from gpufleet_contracts import subjects
from gpufleet_devstack import EmbeddedMongo, NatsServer
from gpufleet_store import Store, Transaction
from nats.js.api import StreamConfig

from ..conftest import admin_connect, broker_for, store_for
from .test_bus import read_stream

pytestmark = pytest.mark.integration

SUBJECT = subjects.event("test", "tick")
TYPE = "gpufleet.test.tick.v1"
SOURCE = "gpufleet/svc"


@pytest.fixture
async def store(mongo_server: EmbeddedMongo, db_prefix: str) -> AsyncIterator[Store]:
    store = store_for("svc", mongo_server.url, db_prefix)
    await store.ensure_indexes({"things": []})
    yield store
    await store.close()


@pytest.fixture
async def broker(fresh_nats: NatsServer) -> AsyncIterator[NatsBroker]:
    """Connected, with no stream declared: each test declares what it needs."""
    broker = broker_for("svc", fresh_nats)
    await broker.connect()
    yield broker
    await broker.stop()


async def declare_streams(broker: NatsBroker, *, update: bool = False) -> None:
    """The streams as a service declares them (create if missing), or as an operator
    applies them (`update`: an existing stream takes this release's configuration)."""
    await ensure_streams((await broker.connect()).jetstream(), update=update)


async def write(store: Store, ids: list[str], payload: bytes = b"{}") -> None:
    """One transaction: a state write and one message per id."""

    async def body(tx: Transaction) -> None:
        await store.db.things.insert_one({}, session=tx.session)
        for msg_id in ids:
            assert tx.emit(SUBJECT, TYPE, payload, msg_id) == msg_id

    await store.transaction(body)


async def stream_ids(server: NatsServer) -> list[str]:
    return [(m.headers or {})["Nats-Msg-Id"] for m in await read_stream(server, SUBJECT)]


async def test_transactions_of_none_one_and_many_messages_go_out_in_order(
    fresh_nats: NatsServer,
    store: Store,
    broker: NatsBroker,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(outbox_module, "ROUND_MESSAGES", 3_000)  # two rounds: 4,001 + 506
    await declare_streams(broker)
    await write(store, [])
    assert await store.db.outbox.count_documents({}) == 0  # no message, no document

    one, many = ["one"], [f"many-{i}" for i in range(4_500)]
    small = [[f"small-{t}-{i}" for i in range(2)] for t in range(3)]
    for ids in (one, many, *small):
        await write(store, ids)
    docs = await store.db.outbox.find().sort([("created_at", 1), ("seq", 1)]).to_list(None)
    assert [d["count"] for d in docs] == [1, 2_000, 2_000, 500, 2, 2, 2]

    relay = OutboxRelay(store, broker, SOURCE, keep=timedelta(0))
    assert await relay.drain() == 4_507
    assert await store.db.outbox.count_documents({}) == 0  # keep=0: deleted once acked
    expected = one + many + [i for ids in small for i in ids]
    assert await stream_ids(fresh_nats) == expected

    (first, *_) = await read_stream(fresh_nats, SUBJECT)
    assert first.headers is not None
    assert {k: v for k, v in first.headers.items() if k != "ce-time"} == {
        "ce-specversion": "1.0",
        "ce-id": "one",
        "ce-source": SOURCE,
        "ce-type": TYPE,
        "ce-subject": SUBJECT,
        "content-type": "application/json",
        "Nats-Msg-Id": "one",
        "Nats-Expected-Stream": subjects.STREAM_EVENTS,
    }


async def test_a_restarted_relay_sends_again_and_jetstream_keeps_one_copy(
    fresh_nats: NatsServer, store: Store, broker: NatsBroker
) -> None:
    await declare_streams(broker)
    ids = [f"m-{i}" for i in range(2_500)] + ["last"]
    await write(store, ids[:-1])
    await write(store, ids[-1:])
    assert await OutboxRelay(store, broker, SOURCE).drain() == len(ids)
    kept = await store.db.outbox.find().to_list(None)
    assert len(kept) == 3 and all(d["published"] and d["published_ms"] for d in kept)

    # A crash after publishing but before marking: a new relay sends everything again...
    await store.db.outbox.update_many({}, {"$set": {"published": False}})
    assert await OutboxRelay(store, broker, SOURCE).drain() == len(ids)
    # ...and JetStream drops the copies by their Nats-Msg-Id.
    js = (await broker.connect()).jetstream()
    assert (await js.stream_info(subjects.STREAM_EVENTS)).state.messages == len(ids)
    assert await stream_ids(fresh_nats) == ids


async def test_a_refused_document_stays_unpublished_and_goes_out_once_it_can(
    fresh_nats: NatsServer, store: Store, broker: NatsBroker
) -> None:
    relay = OutboxRelay(store, broker, SOURCE, keep=timedelta(0))
    await write(store, ["a1", "a2", "a3"])
    await write(store, ["big"], payload=b"x" * 1_000)

    # No stream holds the subject: the server answers "no responders"; nothing is marked.
    with pytest.raises(OutboxPublishError, match="503"):
        await relay.drain()
    assert await store.db.outbox.count_documents({"published": False}) == 2

    # A stream that refuses the big message: the first document is acknowledged and
    # deleted, the second stays for later.
    js = (await broker.connect()).jetstream()
    await js.add_stream(
        StreamConfig(
            name=subjects.STREAM_EVENTS, subjects=[f"{subjects.EVENTS}.>"], max_msg_size=500
        )
    )
    with pytest.raises(OutboxPublishError, match="maximum"):
        await relay.drain()
    (left,) = await store.db.outbox.find().to_list(None)
    assert left["count"] == 1 and left["published"] is False

    await declare_streams(broker, update=True)  # an operator applies the usual configuration
    assert await relay.drain() == 1
    assert await store.db.outbox.count_documents({}) == 0
    assert await stream_ids(fresh_nats) == ["a1", "a2", "a3", "big"]


async def test_missing_acks_time_out_and_the_document_is_sent_again(
    fresh_nats: NatsServer,
    store: Store,
    broker: NatsBroker,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(outbox_module, "ACK_TIMEOUT_S", 0.3)
    # Someone listens on the subject but no stream holds it: no ack and no "no responders".
    nc = await admin_connect(fresh_nats)
    await nc.subscribe(SUBJECT)
    await nc.flush()
    relay = OutboxRelay(store, broker, SOURCE)
    await write(store, ["t1", "t2"])
    with pytest.raises(OutboxPublishError, match="2 acks missing"):
        await relay.drain()
    assert await store.db.outbox.count_documents({"published": False}) == 1

    await declare_streams(broker)
    assert await relay.drain() == 2
    assert await store.db.outbox.count_documents({"published": True}) == 1
    assert await stream_ids(fresh_nats) == ["t1", "t2"]
    await nc.close()


async def test_a_subject_no_stream_holds_is_published_without_waiting_for_an_ack(
    fresh_nats: NatsServer, store: Store, broker: NatsBroker
) -> None:
    await declare_streams(broker)
    subject = subjects.heartbeat("n1")  # core NATS
    nc = await admin_connect(fresh_nats)
    sub = await nc.subscribe(subject)
    await nc.flush()

    async def body(tx: Transaction) -> None:
        tx.emit(subject, "gpufleet.test.beat.v1", b"beat", "hb-1")
        tx.emit(SUBJECT, TYPE, b"{}", "tick-1")

    await store.transaction(body)
    assert await OutboxRelay(store, broker, SOURCE, keep=timedelta(0)).drain() == 2
    got = await sub.next_msg(timeout=5)
    assert got.data == b"beat" and got.headers is not None
    assert got.headers["Nats-Msg-Id"] == "hb-1" and "Nats-Expected-Stream" not in got.headers
    assert await stream_ids(fresh_nats) == ["tick-1"]
    assert await store.db.outbox.count_documents({}) == 0
    await nc.close()


async def wait_for_stream(server: NatsServer, n: int, limit_s: float = 10.0) -> list[str]:
    deadline = asyncio.get_running_loop().time() + limit_s
    while True:
        ids = await stream_ids(server)
        if len(ids) >= n or asyncio.get_running_loop().time() > deadline:
            return ids
        await asyncio.sleep(0.05)


async def test_committed_documents_go_out_from_memory_without_reading_the_outbox_back(
    fresh_nats: NatsServer, store: Store, broker: NatsBroker
) -> None:
    await declare_streams(broker)
    relay = OutboxRelay(store, broker, SOURCE, poll_s=60, keep=timedelta(0))
    relay.start()
    try:
        batches = [[f"t{t}-{i}" for i in range(3)] for t in range(5)]
        for ids in batches:
            await write(store, ids)
        expected = [i for ids in batches for i in ids]
        assert await wait_for_stream(fresh_nats, len(expected)) == expected
        assert relay.store_reads == 1  # once at start; the rest came from memory
        assert await store.db.outbox.count_documents({}) == 0
    finally:
        await relay.stop()


async def test_what_another_process_left_in_the_outbox_goes_out_at_the_next_poll(
    fresh_nats: NatsServer,
    store: Store,
    broker: NatsBroker,
    mongo_server: EmbeddedMongo,
    db_prefix: str,
) -> None:
    await declare_streams(broker)
    relay = OutboxRelay(store, broker, SOURCE, poll_s=0.2, keep=timedelta(0))
    relay.start()
    other = store_for("svc", mongo_server.url, db_prefix)
    try:
        await write(store, ["mine-1"])
        await write(other, ["theirs-1"])  # no relay of this process is told about it
        await write(store, ["mine-2"])
        ids = await wait_for_stream(fresh_nats, 3)
        assert sorted(ids) == ["mine-1", "mine-2", "theirs-1"]
        assert ids.index("mine-1") < ids.index("mine-2")
    finally:
        await relay.stop()
        await other.close()


async def test_after_a_failed_round_memory_is_dropped_and_the_store_keeps_the_order(
    fresh_nats: NatsServer, store: Store, broker: NatsBroker
) -> None:
    relay = OutboxRelay(store, broker, SOURCE, poll_s=60, keep=timedelta(0))
    await relay.drain()  # the store is empty: from now on, memory
    await write(store, ["a1", "a2"])
    with pytest.raises(OutboxPublishError, match="503"):  # no stream yet
        await relay._drain(read_store=False)
    await write(store, ["b1"])  # committed after the failure, in memory too
    await declare_streams(broker)
    reads = relay.store_reads
    assert await relay._drain(read_store=False) == 3  # from the store, oldest first
    assert relay.store_reads == reads + 1
    assert await stream_ids(fresh_nats) == ["a1", "a2", "b1"]
    assert await store.db.outbox.count_documents({}) == 0
    assert await relay._drain(read_store=False) == 0


async def test_memory_holds_a_bounded_backlog_and_the_store_the_rest(
    fresh_nats: NatsServer,
    store: Store,
    broker: NatsBroker,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(outbox_module, "FRESH_MAX_DOCS", 3)
    await declare_streams(broker)
    relay = OutboxRelay(store, broker, SOURCE, poll_s=60, keep=timedelta(0))
    await relay.drain()  # from now on, memory
    for t in range(5):  # nobody drains meanwhile: memory gives up at the fourth
        await write(store, [f"t{t}"])
    reads = relay.store_reads
    assert await relay._drain(read_store=False) == 5
    assert relay.store_reads == reads + 1
    assert await stream_ids(fresh_nats) == [f"t{t}" for t in range(5)]
