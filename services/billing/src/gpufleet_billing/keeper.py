"""What every part of billing shares: the store, the clock, one lock and the day cursors.

One lock serialises this process's writes; unique entry keys stop two processes (`_write`
recomputes a settlement another process took first). `stopping` is read between settlements
by the clock's long rounds, so that a shutdown never waits for a whole backlog.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import date

from gpufleet_contracts.clock import Clock
from gpufleet_store import Store, Transaction
from pymongo.errors import BulkWriteError, DuplicateKeyError


class Keeper:
    def __init__(self, store: Store, clock: Clock) -> None:
        self.store = store
        self.db = store.db
        self.clock = clock
        self.lock = asyncio.Lock()
        # Set by the composition root: true once the clock's periodic job is stopping.
        self.halted: Callable[[], bool] = lambda: False

    @property
    def stopping(self) -> bool:
        """The service is stopping: the clock stops between settlements, the rest waits for
        the next start."""
        return self.halted()

    async def _write(self, body: Callable[[Transaction], Awaitable[int]]) -> int:
        """Run a settling transaction (the caller holds the lock); recompute if another
        process took the same keys first."""
        for _ in range(5):
            try:
                return await self.store.transaction(body)
            except (DuplicateKeyError, BulkWriteError) as exc:
                if isinstance(exc, BulkWriteError) and any(
                    e.get("code") != 11000 for e in exc.details.get("writeErrors", [])
                ):
                    raise
        raise RuntimeError("ledger keys kept colliding")

    async def _cursor(self, key: str) -> date | None:
        doc = await self.db.cursors.find_one({"_id": key})
        return date.fromisoformat(doc["next_day"]) if doc else None

    async def _set_cursor(self, key: str, day: date) -> None:
        await self.db.cursors.replace_one(
            {"_id": key}, {"_id": key, "next_day": day.isoformat()}, upsert=True
        )
