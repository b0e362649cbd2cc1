"""Publishes what services wrote to their `outbox` collection, in order, after commit.

A batch at a time: every message of the batch is sent without waiting in between (JetStream
keeps the order of one connection's publishes), then the acks are awaited together. Only the
longest acknowledged prefix is marked done; the rest is sent again under the same ids, which
JetStream drops if it already has them, so nothing is lost and nothing is doubled. Waiting
for each ack in turn cost about 1 ms a message and capped the scheduler near 60 jobs/s
(benchmarks/scheduler).

Messages go out on the broker's own connection through nats-py's JetStream context, not
FastStream's `publish`: its per-publish middleware (an OpenTelemetry span each) cost more CPU
than the rest of a job's path on a 2-core machine. The bytes and CloudEvents headers are the
same; what is not recorded is a producer span per outbox message.

Published rows are kept for `keep` (default one hour, for inspection), or deleted at once
with `keep=timedelta(0)`: nx-27017 scans the whole outbox for `{published: false}`, 70 ms a
poll at 20,000 kept rows (measured), so a high-rate service keeps none.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import timedelta
from typing import Any

from faststream.nats import NatsBroker
from gpufleet_contracts import Envelope
from gpufleet_store import Store, now_ms, utcnow
from gpufleet_store.store import OUTBOX

from .streams import stream_for

log = logging.getLogger("gpufleet.outbox")

BATCH = 500


class OutboxRelay:
    def __init__(
        self,
        store: Store,
        broker: NatsBroker,
        source: str,
        poll_s: float = 1.0,
        keep: timedelta = timedelta(hours=1),
    ) -> None:
        self.store = store
        self.broker = broker
        self.source = source
        self.poll_s = poll_s
        self.keep = keep
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        store.outbox_written = self._wake.set

    async def drain(self) -> int:
        """Publish every unpublished message; returns how many were published."""
        sent = 0
        coll = self.store.db[OUTBOX]
        js = (await self.broker.connect()).jetstream()
        while True:
            batch = await coll.find({"published": False}).sort("created_at", 1).to_list(BATCH)
            if not batch:
                return sent
            results = await asyncio.gather(
                *(self._send(js, doc) for doc in batch), return_exceptions=True
            )
            ok = next((i for i, r in enumerate(results) if isinstance(r, BaseException)), None)
            done = [d["_id"] for d in batch[: len(batch) if ok is None else ok]]
            if done:
                if self.keep:
                    await coll.update_many(
                        {"_id": {"$in": done}},
                        {"$set": {"published": True, "published_ms": now_ms()}},
                    )
                else:
                    await coll.delete_many({"_id": {"$in": done}})
                sent += len(done)
            if ok is not None:
                failed = results[ok]
                assert isinstance(failed, BaseException)
                raise failed

    async def _send(self, js: Any, doc: dict[str, Any]) -> object:
        env = Envelope(type=doc["type"], source=self.source, subject=doc["subject"], id=doc["_id"])
        return await js.publish(
            doc["subject"],
            bytes(doc["payload"]),
            timeout=5.0,
            stream=stream_for(doc["subject"]),
            headers=env.headers(),
        )

    async def _run(self) -> None:
        last_purge = utcnow()
        while True:
            try:
                await self.drain()
                if self.keep and utcnow() - last_purge > timedelta(minutes=5):
                    await self.store.db[OUTBOX].delete_many(
                        {
                            "published": True,
                            "published_ms": {
                                "$lt": now_ms() - int(self.keep.total_seconds() * 1000)
                            },
                        }
                    )
                    last_purge = utcnow()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("outbox relay failed; retrying")
                await asyncio.sleep(1.0)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self.poll_s)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"outbox-{self.source}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
