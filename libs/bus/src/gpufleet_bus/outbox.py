"""Publishes what services wrote to their `outbox` collection, in order, after commit."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import timedelta

from gpufleet_store import Store, now_ms, utcnow
from gpufleet_store.store import OUTBOX

from .publish import Publisher, publish_raw

log = logging.getLogger("gpufleet.outbox")


class OutboxRelay:
    def __init__(
        self,
        store: Store,
        broker: Publisher,
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
        while True:
            batch = await coll.find({"published": False}).sort("created_at", 1).to_list(200)
            if not batch:
                return sent
            for doc in batch:
                await publish_raw(
                    self.broker,
                    doc["subject"],
                    bytes(doc["payload"]),
                    type_=doc["type"],
                    source=self.source,
                    msg_id=doc["_id"],
                )
                await coll.update_one(
                    {"_id": doc["_id"]}, {"$set": {"published": True, "published_ms": now_ms()}}
                )
                sent += 1

    async def _run(self) -> None:
        last_purge = utcnow()
        while True:
            try:
                await self.drain()
                if utcnow() - last_purge > timedelta(minutes=5):
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
