"""State and its events commit together; the relay publishes after commit, exactly once."""

from __future__ import annotations

import pytest
from gpufleet_bus import OutboxRelay, Ports, ServiceRuntime, emit
from gpufleet_contracts import Event, subjects
from gpufleet_devstack import EmbeddedMongo, NatsServer
from gpufleet_store import Transaction
from gpufleet_store.store import outbox_messages

from ..conftest import broker_for, running, store_for
from .test_bus import read_stream


class Counted(Event):
    TYPE = "gpufleet.test.counted.v1"
    SUBJECT = subjects.event("test", "counted")
    n: int


async def test_commit_writes_state_and_outbox_then_relay_publishes_once(
    fresh_nats: NatsServer,
    mongo_server: EmbeddedMongo,
    db_prefix: str,
) -> None:
    store = store_for("svc", mongo_server.url, db_prefix)
    broker = broker_for("svc", fresh_nats)
    async with running(ServiceRuntime("svc", Ports(broker, store), indexes={"things": []}).app):

        async def body(tx: Transaction) -> None:
            await store.db.things.insert_one({"_id": 1}, session=tx.session)
            emit(tx, Counted(n=1), msg_id="counted-1")

        await store.transaction(body)
        # One outbox document per transaction, its messages packed in one binary field.
        (doc,) = await store.db.outbox.find().to_list(None)
        assert doc["count"] == 1 and doc["published"] is False
        assert [m[0] for m in outbox_messages(doc)] == ["counted-1"]
        relay = OutboxRelay(store, broker, "gpufleet/svc")
        await relay.drain()
        # A crash after publishing but before marking: the document is published again...
        await store.db.outbox.update_many({}, {"$set": {"published": False}})
        assert await relay.drain() == 1
    # ...and JetStream keeps one copy, because the outbox id is the message id.
    msgs = await read_stream(fresh_nats, Counted.SUBJECT)
    assert len(msgs) == 1 and msgs[0].headers["Nats-Msg-Id"] == "counted-1"  # type: ignore[index]
    assert await store.db.things.count_documents({}) == 1
    await store.close()


async def test_aborted_transaction_leaves_neither_state_nor_event(
    mongo_server: EmbeddedMongo,
    db_prefix: str,
) -> None:
    store = store_for("svc", mongo_server.url, db_prefix)
    await store.ensure_indexes({"things": []})

    async def body(tx: Transaction) -> None:
        await store.db.things.insert_one({"_id": 1}, session=tx.session)
        emit(tx, Counted(n=1))
        raise RuntimeError("crash inside the transaction")

    with pytest.raises(RuntimeError):
        await store.transaction(body)
    assert await store.db.things.count_documents({}) == 0
    assert await store.db.outbox.count_documents({}) == 0
    await store.close()


async def test_relay_catches_up_after_nats_comes_back(
    fresh_nats: NatsServer,
    mongo_server: EmbeddedMongo,
    db_prefix: str,
) -> None:
    store = store_for("svc", mongo_server.url, db_prefix)
    broker = broker_for("svc", fresh_nats)
    async with running(ServiceRuntime("svc", Ports(broker, store)).app):
        fresh_nats.kill()

        async def body(tx: Transaction) -> None:
            emit(tx, Counted(n=2))

        await store.transaction(body)  # the database write does not need the bus
        fresh_nats.restart()
        from gpufleet_devstack import wait_for_async

        async def published() -> bool:  # the transaction's one document
            return await store.db.outbox.count_documents({"published": True}) == 1

        await wait_for_async(published, timeout=20)
    assert len(await read_stream(fresh_nats, Counted.SUBJECT)) == 1
    await store.close()
