"""Keeps Python's full garbage collections off the scheduler's hot path.

The scheduler holds every open job and the whole fleet in memory: at 100,000 jobs, millions
of dicts and lists. CPython's cyclic collector walks all of them at each full collection,
and full collections come about once every ~70,000 net allocations once memory grows: while
jobs streamed in at ~650 a second, one fired every ~2 s and took ~200 ms (3.0 of the 3.5 s
spent collecting in 27 s, measured with `gc.callbacks`), a pause every request in flight
waited through.

What survives a placement pass is long-lived (jobs, nodes, their indexes), so it is frozen
(`gc.freeze`, a constant-time list splice): later collections only look at what is younger.
Jobs and nodes are plain trees that reference counting frees. What may be frozen while it
is part of a cycle (a task or an exception alive at that moment) is not reclaimed until the
next sweep: every `sweep_every_s` the frozen objects are released and collected once.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from collections.abc import Callable, Iterator

log = logging.getLogger("gpufleet.scheduler.heap")

SWEEP_EVERY_S = 600.0


class Heap:
    def __init__(
        self, sweep_every_s: float = SWEEP_EVERY_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.sweep_every_s = sweep_every_s
        self.clock = clock
        self._swept = clock()
        self.sweeps = 0

    def settle(self) -> None:
        """After a pass (or a load): freeze what lives on; sweep once in a while."""
        now = self.clock()
        if now - self._swept >= self.sweep_every_s:
            self._swept = now
            self.sweeps += 1
            t0 = time.perf_counter()
            gc.unfreeze()
            found = gc.collect()
            log.info(
                "swept the heap: %d unreachable objects, %.0f ms",
                found,
                (time.perf_counter() - t0) * 1000,
            )
        gc.freeze()


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No collection at all meanwhile (building memory from the store allocates millions of
    containers that all live on: a collection every 700 of them would find nothing)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
