"""A consumer handled a batch at a time (gpufleet_bus.Batched), against a real nats-server:
stream order across types, the same dead-letter path and retry policy as one at a time."""

from __future__ import annotations

import asyncio
import json

from gpufleet_bus import Batched, Delivery, Ports, ServiceRuntime, publish
from gpufleet_bus.streams import ensure_streams
from gpufleet_contracts import Envelope, Message, subjects
from gpufleet_devstack import NatsServer, wait_for_async

from ..conftest import admin_connect, broker_for, running
from .test_bus import Pinged, Ponged, read_stream


async def test_batches_keep_stream_order_dead_letter_the_invalid_and_retry_a_failure(
    fresh_nats: NatsServer,
) -> None:
    broker = broker_for("svc", fresh_nats)
    rt = ServiceRuntime("svc", Ports(broker))
    seen: list[tuple[str, int]] = []
    batches: list[int] = []
    failures = [1]  # the first batch that holds n=5 fails once: it is handed over again

    async def handle(batch: list[tuple[Message, Delivery]]) -> None:
        if failures and any(getattr(m, "n", None) == 5 for m, _ in batch):
            failures.pop()
            raise RuntimeError("the store is away")
        batches.append(len(batch))
        for m, d in batch:
            assert d.received_at is not None and d.subject == m.SUBJECT
            seen.append((type(m).__name__, m.n))  # type: ignore[attr-defined]

    rt.wire(events={"test": Batched([Pinged, Ponged], handle, subject="gpufleet.v1.evt.test.>")})
    async with running(rt.app):
        for n in range(10):
            await publish(broker, (Pinged if n % 2 else Ponged)(n=n), source="test")
        nc = await admin_connect(fresh_nats)
        js = nc.jetstream()
        other = Envelope(type="gpufleet.test.other.v1", source="t", subject=Pinged.SUBJECT)
        await js.publish(Pinged.SUBJECT, b'{"n": 99}', headers=other.headers())
        bad = Envelope(type=Pinged.TYPE, source="t", subject=Pinged.SUBJECT)
        await js.publish(Pinged.SUBJECT, b'{"n": "not a number"}', headers=bad.headers())
        await nc.close()
        await wait_for_async(lambda: len(seen) >= 10, timeout=20)

        async def both_dead_lettered() -> bool:
            return len(await read_stream(fresh_nats, subjects.dead_letter("svc", "*"))) >= 2

        await wait_for_async(both_dead_lettered, timeout=20)
    handled = sorted(seen, key=lambda s: s[1])
    assert handled == [("Ponged" if n % 2 == 0 else "Pinged", n) for n in range(10)]
    assert [n for _, n in seen if n < 5] == [0, 1, 2, 3, 4]  # in stream order until the retry
    assert not failures  # it failed once, was redelivered and handled
    dead = await read_stream(fresh_nats, subjects.dead_letter("svc", "*"))
    fields = sorted(json.loads(m.data)["errors"][0]["field"] for m in dead)
    assert fields == ["ce-type", "n"]


async def test_a_message_the_handler_cannot_take_never_holds_back_the_rest_of_its_batch(
    fresh_nats: NatsServer,
) -> None:
    """A batch that fails is handled again one message at a time: the others are applied
    and acked, only the failing one waits for its retries (and, in the end, dead-letters)."""
    broker = broker_for("svc", fresh_nats)
    rt = ServiceRuntime("svc", Ports(broker))
    seen: list[int] = []
    attempts: list[int] = []

    async def handle(batch: list[tuple[Message, Delivery]]) -> None:
        numbers = [m.n for m, _ in batch]  # type: ignore[attr-defined]
        if 5 in numbers:
            attempts.append(len(batch))
            raise RuntimeError("n=5 cannot be applied")
        seen.extend(numbers)

    rt.wire(events={"test": Batched([Pinged, Ponged], handle, subject="gpufleet.v1.evt.test.>")})
    nc = await admin_connect(fresh_nats)
    await ensure_streams(nc.jetstream())
    for n in range(10):  # all stored before the consumer starts: one batch of ten
        m = (Pinged if n % 2 else Ponged)(n=n)
        env = Envelope(type=m.TYPE, source="t", subject=m.SUBJECT)
        await nc.jetstream().publish(m.SUBJECT, m.model_dump_json().encode(), headers=env.headers())
    await nc.close()
    async with running(rt.app):
        await wait_for_async(lambda: len(seen) >= 9, timeout=20)
    assert seen == [n for n in range(10) if n != 5]  # in stream order, the poison left out
    assert attempts[0] == 10 and all(a == 1 for a in attempts[1:])


async def test_a_batched_consumer_subscribes_again_when_its_consumer_is_gone(
    fresh_nats: NatsServer,
) -> None:
    """A server restarted without the durable consumer (lost with its store, or deleted by an
    operator): every fetch fails until the consumer subscribes again, which makes it anew;
    what the stream holds is then handled (again: handlers are idempotent)."""
    broker = broker_for("svc", fresh_nats)
    rt = ServiceRuntime("svc", Ports(broker))
    seen: list[int] = []

    async def handle(batch: list[tuple[Message, Delivery]]) -> None:
        seen.extend(m.n for m, _ in batch)  # type: ignore[attr-defined]

    async def send(n: int) -> None:
        nc = await admin_connect(fresh_nats)
        m = Pinged(n=n)
        env = Envelope(type=m.TYPE, source="t", subject=m.SUBJECT)
        await nc.jetstream().publish(m.SUBJECT, m.model_dump_json().encode(), headers=env.headers())
        await nc.close()

    rt.wire(events={"test": Batched([Pinged, Ponged], handle, subject="gpufleet.v1.evt.test.>")})
    async with running(rt.app):
        await send(1)
        await wait_for_async(lambda: seen == [1], timeout=20)
        fresh_nats.kill()
        await asyncio.sleep(1.5)  # fetches fail meanwhile
        fresh_nats.restart()
        nc = await admin_connect(fresh_nats)
        await nc.jetstream().delete_consumer(subjects.STREAM_EVENTS, "svc-test")
        await nc.close()
        await send(2)
        await wait_for_async(lambda: seen[-1:] == [2], timeout=30)
    assert seen in ([1, 2], [1, 1, 2])


async def test_a_stopping_batched_consumer_leaves_the_drain_nothing_to_wait_for(
    fresh_nats: NatsServer,
) -> None:
    """An idle consumer's fetches time out on the client, and the server's late `408
    Request Timeout`s used to stay in its pull subscription: the broker's drain waited for
    them its whole drain_timeout (30 s) at every stop."""
    broker = broker_for("svc", fresh_nats)
    rt = ServiceRuntime("svc", Ports(broker))
    seen: list[int] = []

    async def handle(batch: list[tuple[Message, Delivery]]) -> None:
        seen.extend(m.n for m, _ in batch)  # type: ignore[attr-defined]

    rt.wire(events={"test": Batched([Pinged], handle, subject=Pinged.SUBJECT)})
    await rt.app.start()
    try:
        await publish(broker, Pinged(n=1), source="test")
        await wait_for_async(lambda: seen == [1], timeout=10)
        await asyncio.sleep(3.5)  # idle: a few fetches time out
    finally:
        began = asyncio.get_running_loop().time()
        await rt.app.stop()
    assert asyncio.get_running_loop().time() - began < 10


async def test_a_busy_stream_is_taken_in_fewer_batches_and_a_quiet_one_at_once(
    fresh_nats: NatsServer,
) -> None:
    """linger_s: after a batch of several that was not full the next fetch waits, so what
    comes meanwhile is one batch; a message that comes alone is handled at once, and so is
    the next one (a batch of one never lingers)."""
    loop = asyncio.get_running_loop()
    broker = broker_for("svc", fresh_nats)
    rt = ServiceRuntime("svc", Ports(broker))
    batches: list[list[int]] = []
    times: list[float] = []

    async def handle(batch: list[tuple[Message, Delivery]]) -> None:
        batches.append([m.n for m, _ in batch])  # type: ignore[attr-defined]
        times.append(loop.time())

    spec = Batched([Pinged], handle, subject=Pinged.SUBJECT, max_batch=5, linger_s=1.0)
    rt.wire(events={"test": spec})
    nc = await admin_connect(fresh_nats)
    await ensure_streams(nc.jetstream())
    for n in range(2):  # in the stream before the consumer's first fetch
        await nc.jetstream().publish(
            Pinged.SUBJECT,
            Pinged(n=n).model_dump_json().encode(),
            headers=Envelope(type=Pinged.TYPE, source="t", subject=Pinged.SUBJECT).headers(),
        )
    await nc.close()
    async with running(rt.app):
        await wait_for_async(lambda: len(batches) >= 1, timeout=10)
        for n in range(2, 12):  # while it lingers after [0, 1]
            await publish(broker, Pinged(n=n), source="test")
        await wait_for_async(lambda: sum(len(b) for b in batches) >= 12, timeout=20)
        assert batches == [[0, 1], [2, 3, 4, 5, 6], [7, 8, 9, 10, 11]]
        assert times[1] - times[0] >= 0.8  # it lingered after a batch of two
        for n in (12, 13):  # quiet: each alone, each at once
            sent = loop.time()
            await publish(broker, Pinged(n=n), source="test")
            await wait_for_async(lambda: batches[-1] == [n], timeout=10)  # noqa: B023
            assert times[-1] - sent < 0.8
