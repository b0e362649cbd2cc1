"""A consumer handled a batch at a time (gpufleet_bus.Batched), against a real nats-server:
stream order across types, the same dead-letter path and retry policy as one at a time."""

from __future__ import annotations

import json

from gpufleet_bus import Batched, Delivery, Ports, ServiceRuntime, publish
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
    handled = sorted(seen, key=lambda s: s[1])
    assert handled == [("Ponged" if n % 2 == 0 else "Pinged", n) for n in range(10)]
    assert [n for _, n in seen if n < 5] == [0, 1, 2, 3, 4]  # in stream order until the retry
    assert not failures  # it failed once, was redelivered and handled
    dead = await read_stream(fresh_nats, subjects.dead_letter("svc", "*"))
    fields = sorted(json.loads(m.data)["errors"][0]["field"] for m in dead)
    assert fields == ["ce-type", "n"]
