"""The outbox relay against a nats-server with a small max_payload: a message that can never
be published is dead-lettered (subject, type, id, size, why; never its body) and the messages
behind it go out; one that cannot be published *yet* still waits."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from faststream.nats import NatsBroker
from gpufleet_bus import OutboxRelay, ensure_streams
from gpufleet_bus.outbox import OutboxPublishError
from gpufleet_contracts import subjects
from gpufleet_devstack import EmbeddedMongo, NatsServer
from gpufleet_store import Store, Transaction

from ..conftest import broker_for, store_for
from .test_bus import read_stream

pytestmark = pytest.mark.integration

MAX_PAYLOAD = 4096  # bytes of headers and body together, as the server counts them
SUBJECT = subjects.event("test", "tick")
TYPE = "gpufleet.test.tick.v1"
DLQ = subjects.dead_letter("svc", "*")
SECRET = b"AWS_SECRET_ACCESS_KEY=hunter2"


@pytest.fixture
def small_nats(tmp_path: Path) -> Iterator[NatsServer]:
    """A nats-server of this test's own whose max_payload is 4 KiB (nats-server 2.9 has no
    command-line flag for it: a config file sets it)."""
    server = NatsServer(tmp_path / "store", config=f"max_payload: {MAX_PAYLOAD}\n")
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def store(mongo_server: EmbeddedMongo, db_prefix: str) -> AsyncIterator[Store]:
    store = store_for("svc", mongo_server.url, db_prefix)
    await store.ensure_indexes({"things": []})
    yield store
    await store.close()


@pytest.fixture
async def broker(small_nats: NatsServer) -> AsyncIterator[NatsBroker]:
    broker = broker_for("svc", small_nats)
    await broker.connect()
    yield broker
    await broker.stop()


async def write(store: Store, *messages: tuple[str, bytes] | tuple[str, bytes, str]) -> None:
    """One transaction emitting (id, payload[, subject]) messages, in order."""

    async def body(tx: Transaction) -> None:
        for msg_id, payload, *subject in messages:
            tx.emit(subject[0] if subject else SUBJECT, TYPE, payload, msg_id)

    await store.transaction(body)


async def published(server: NatsServer) -> list[str]:
    return [(m.headers or {})["Nats-Msg-Id"] for m in await read_stream(server, SUBJECT)]


async def dead_letters(server: NatsServer) -> list[dict[str, object]]:
    return [json.loads(m.data) for m in await read_stream(server, DLQ)]


async def test_an_unpublishable_message_is_dead_lettered_and_the_later_ones_go_out(
    small_nats: NatsServer, store: Store, broker: NatsBroker
) -> None:
    await ensure_streams((await broker.connect()).jetstream())
    big = b"{" + SECRET + b"x" * MAX_PAYLOAD + b"}"
    # The body alone fits, but not with its ~300 bytes of headers: nats-py would send it and
    # the server would close the connection (and the next attempt would do the same).
    edge = SECRET + b"y" * (MAX_PAYLOAD - 100 - len(SECRET))
    await write(store, ("a1", b"{}"), ("big", big), ("a2", b"{}"))
    await write(store, ("edge", edge))
    await write(store, ("bad-subject", b"{}", f"{SUBJECT}.not a subject"), ("b1", b"{}"))
    await write(store, ("c1", b"{}"))

    relay = OutboxRelay(store, broker, "gpufleet/svc", keep=timedelta(0))
    assert await relay.drain() == 4
    assert relay.dead_lettered == 3
    assert await published(small_nats) == ["a1", "a2", "b1", "c1"]
    assert await store.db.outbox.count_documents({}) == 0  # every document is done

    records = await dead_letters(small_nats)
    assert [r["errors"][0]["id"] for r in records] == ["big", "edge", "bad-subject"]  # type: ignore[index]
    first = records[0]
    assert first["service"] == "svc" and first["subject"] == SUBJECT
    assert first["reason"] == "unpublishable"
    (detail,) = first["errors"]  # type: ignore[misc]
    assert detail["type"] == TYPE and detail["size"] == len(big)
    assert detail["max_payload"] == MAX_PAYLOAD and "MaxPayloadError" in detail["error"]
    assert first["headers"]["ce-id"] == "big"  # type: ignore[index]
    assert records[2]["errors"][0]["error"].startswith("BadSubjectError")  # type: ignore[index]
    for m in await read_stream(small_nats, DLQ):
        assert SECRET not in m.data and b"xxxx" not in m.data  # never the body


async def test_after_a_crash_the_message_is_dead_lettered_again_and_kept_once(
    small_nats: NatsServer, store: Store, broker: NatsBroker
) -> None:
    await ensure_streams((await broker.connect()).jetstream())
    await write(store, ("big", b"z" * (2 * MAX_PAYLOAD)), ("a1", b"{}"))
    assert await OutboxRelay(store, broker, "gpufleet/svc").drain() == 1

    # A crash after publishing but before marking: the next relay sends the document again.
    await store.db.outbox.update_many({}, {"$set": {"published": False}})
    relay = OutboxRelay(store, broker, "gpufleet/svc")
    assert await relay.drain() == 1 and relay.dead_lettered == 1
    assert await published(small_nats) == ["a1"]
    assert [r["errors"][0]["id"] for r in await dead_letters(small_nats)] == ["big"]  # type: ignore[index]


async def test_without_a_stream_for_the_dead_letter_the_document_waits(
    small_nats: NatsServer, store: Store, broker: NatsBroker
) -> None:
    """Transient failures are retried as before: here no stream exists yet (no responders),
    neither for the messages nor for the dead letter, so nothing is marked and nothing lost."""
    relay = OutboxRelay(store, broker, "gpufleet/svc", keep=timedelta(0))
    await write(store, ("a1", b"{}"), ("big", b"z" * (2 * MAX_PAYLOAD)), ("a2", b"{}"))
    with pytest.raises(OutboxPublishError, match="503"):
        await relay.drain()
    assert await store.db.outbox.count_documents({"published": False}) == 1
    assert relay.dead_lettered == 0

    await ensure_streams((await broker.connect()).jetstream())
    assert await relay.drain() == 2 and relay.dead_lettered == 1
    assert await published(small_nats) == ["a1", "a2"]
    assert len(await dead_letters(small_nats)) == 1
    assert await store.db.outbox.count_documents({}) == 0
