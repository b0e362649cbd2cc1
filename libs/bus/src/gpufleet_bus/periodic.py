"""Periodic work of a service (a clock that settles, a lease that is renewed): one helper.

`Every` runs `fn` every `period_s` seconds from the service's start until its stop. A failed
round is logged and the next one runs as planned: periodic work must be idempotent. At stop,
the round in hand may finish within `grace_s` (a settlement is not cut in half) and is
cancelled after that; the wait between rounds ends at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

log = logging.getLogger("gpufleet.bus")


@dataclass
class Every:
    period_s: float
    fn: Callable[[], Awaitable[object]]
    name: str
    at_start: bool = True  # the first round at once, or after one period
    grace_s: float = 10.0
    _task: asyncio.Task[None] | None = field(default=None, init=False, repr=False)
    _stop: asyncio.Event = field(default_factory=asyncio.Event, init=False, repr=False)

    def start(self) -> None:
        if self.period_s > 0 and self._task is None:
            self._stop = asyncio.Event()
            self._task = asyncio.create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        self._stop.set()
        task, self._task = self._task, None
        if task is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout=self.grace_s)
        except TimeoutError:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    async def _run(self) -> None:
        if not self.at_start and await self._wait():
            return
        while not self._stop.is_set():
            try:
                await self.fn()
            except Exception:  # the next round retries
                log.exception("%s failed", self.name)
            if await self._wait():
                return

    async def _wait(self) -> bool:
        """Sleep one period; True when the service is stopping."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), timeout=self.period_s)
        return self._stop.is_set()
