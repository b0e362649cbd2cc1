"""The bytes the node's staging moved, per job: each fetcher and uploader wrapped so that the
progress its transfers tell is also counted, for the agent's /metrics (host/metrics.py
exposes `counts()` as gpufleet_staged_bytes_total and gpufleet_uploaded_bytes_total).

A transfer tells how far it is as a running total (registry.Moved); the tally adds what each
report goes past the furthest one before, so a transfer that starts again (a retry inside a
fetcher) counts nothing twice, and an archive the node's content cache restages unpacked counts
its unpacked size. A hit of that cache counts too: the job got those bytes, though nothing was
fetched. A job's counts stay `keep_s` after
its last transfer, long enough for any scrape to see their final value, and are then dropped
(the series ends, as a GPU series loses a job that ended).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path

from gpufleet_contracts.locations import OutputTarget, Source

from .registry import Fetcher, Fetchers, Moved, Transfer, Uploader, Uploaders

KEEP_S = 900.0  # a job's counts after its last transfer: many scrapes at any interval


class Direction(StrEnum):
    staged = "staged"  # onto the node, into a job's mounts
    uploaded = "uploaded"  # a job's output, off the node


@dataclass(frozen=True, order=True)
class Counted:
    """Whose bytes: a job's (and the account it runs for), one way, by the location's kind."""

    direction: Direction
    job: str
    account: str
    kind: str


class TransferTally:
    def __init__(self, clock: Callable[[], float] = time.monotonic, keep_s: float = KEEP_S):
        self.clock = clock
        self.keep_s = keep_s
        self.bytes: dict[Counted, int] = {}
        self._last: dict[Counted, float] = {}

    def fetchers(self, fetchers: Fetchers) -> Fetchers:
        return Fetchers({k: self._fetcher(k, f) for k, f in fetchers.by_kind.items()})

    def uploaders(self, uploaders: Uploaders) -> Uploaders:
        return Uploaders({k: self._uploader(k, u) for k, u in uploaders.by_kind.items()})

    def _fetcher(self, kind: str, fetch: Fetcher) -> Fetcher:
        async def counted(source: Source, dest: Path, t: Transfer) -> None:
            await fetch(source, dest, self._counting(Direction.staged, kind, t))

        return counted

    def _uploader(self, kind: str, put: Uploader) -> Uploader:
        async def counted(path: Path, target: OutputTarget, t: Transfer) -> None:
            await put(path, target, self._counting(Direction.uploaded, kind, t))

        return counted

    def _counting(self, direction: Direction, kind: str, t: Transfer) -> Transfer:
        key = Counted(direction, t.job_id or "", t.account or "", kind)
        furthest = 0

        def progress(moved: Moved) -> None:
            nonlocal furthest
            if moved.done > furthest:
                self.add(key, moved.done - furthest)
                furthest = moved.done
            t.progress(moved)

        return replace(t, progress=progress)

    def add(self, key: Counted, n: int) -> None:
        self.bytes[key] = self.bytes.get(key, 0) + n
        self._last[key] = self.clock()

    def counts(self) -> dict[Counted, int]:
        """Every job's counts, those untouched for `keep_s` dropped first."""
        stale = self.clock() - self.keep_s
        for key in [k for k, at in self._last.items() if at < stale]:
            del self.bytes[key], self._last[key]
        return dict(sorted(self.bytes.items()))
