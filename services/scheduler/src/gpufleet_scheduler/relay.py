"""The scheduler's outbox relay: the shared one, publishing a batch at a time.

`gpufleet_bus.OutboxRelay` publishes one message, waits for JetStream's ack, marks it,
then the next: about 1 ms a message here, and every job costs five (JobQueued,
JobStateChanged, WorkerPlaced, StartWorker, JobStateChanged), which capped the scheduler at
~60 jobs/s end to end. This relay sends a whole batch in order without waiting in between
(JetStream keeps the order of one connection's publishes), then awaits the acks together
and removes the batch from the outbox with one delete. Only the longest acknowledged
prefix is removed; the rest is sent again under the same ids (JetStream drops what it
already has), so nothing is lost and a retry repeats at most the batch's tail.

Published messages are deleted rather than kept for an hour: nx-27017 does not use the
`(published, created_at)` index for `{published: false}` and scans the whole collection,
70 ms per poll with 20,000 kept messages (measured), which grew every job's latency. The
stream itself is the record of what was published.

It publishes on the broker's own NATS connection through nats-py's JetStream context, not
through FastStream's `publish`: FastStream's per-publish middleware (an OpenTelemetry span
each) cost more CPU than the rest of a job's path on this 2-core machine. The messages are
the same bytes with the same CloudEvents headers; what is lost is a producer span per
outbox message (the handlers' consumer spans remain).
"""

from __future__ import annotations

import asyncio
from typing import cast

from faststream.nats import NatsBroker
from gpufleet_bus.outbox import OutboxRelay
from gpufleet_bus.publish import Publisher
from gpufleet_bus.streams import stream_for
from gpufleet_contracts import Envelope
from gpufleet_store import Store
from gpufleet_store.store import OUTBOX

BATCH = 500


class PipelinedRelay(OutboxRelay):
    def __init__(self, store: Store, broker: NatsBroker, source: str) -> None:
        super().__init__(store, cast(Publisher, broker), source)
        self.nats_broker = broker

    async def drain(self) -> int:
        sent = 0
        coll = self.store.db[OUTBOX]
        js = (await self.nats_broker.connect()).jetstream()
        while True:
            batch = await coll.find({"published": False}).sort("created_at", 1).to_list(BATCH)
            if not batch:
                return sent
            tasks = []
            for doc in batch:
                env = Envelope(
                    type=doc["type"], source=self.source, subject=doc["subject"], id=doc["_id"]
                )
                tasks.append(
                    asyncio.ensure_future(
                        js.publish(
                            doc["subject"],
                            bytes(doc["payload"]),
                            timeout=5.0,
                            stream=stream_for(doc["subject"]),
                            headers=env.headers(),
                        )
                    )
                )
            results = await asyncio.gather(*tasks, return_exceptions=True)
            ok = 0
            for r in results:
                if isinstance(r, BaseException):
                    break
                ok += 1
            if ok:
                await coll.delete_many({"_id": {"$in": [d["_id"] for d in batch[:ok]]}})
                sent += ok
            if ok < len(batch):
                failed = results[ok]
                assert isinstance(failed, BaseException)
                raise failed
