"""Noticing what a sender keeps doing, at a rate it cannot raise: a dead-letter record and a
log line for every message of a flood would be a flood of their own (of the DLQ stream, of
the service's log on disk), so a sender's refusals are noticed once at once, then at most
once per window, each notice counting the ones it stands for.

`burst`: the first refusals of a window are each noticed (one at a time, as if nothing
were limited: a few invalid messages each keep their own record), the rest counted.

A key is whoever is noticed: a node (its minion id), a subject. Keys are bounded
(`max_keys`): past it, the keys longest quiet are forgotten (their next refusal is noticed
at once again), so a sender that makes up keys cannot grow the table.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

WINDOW_S = 60.0
MAX_KEYS = 10_000


@dataclass(frozen=True)
class Notice:
    """`count` refusals of `key` to notice now: the first (1), or all of them since the
    last notice (`since_s` ago)."""

    key: str
    count: int
    since_s: float

    def text(self) -> str:
        """`3 since 60 s`, or `first` for the first of a quiet key."""
        if self.since_s <= 0:
            return "first" if self.count == 1 else f"{self.count}"
        return f"{self.count} in the last {self.since_s:.0f} s"


@dataclass
class _Key:
    noticed_at: float  # when this key's window began
    pending: int = 0  # refusals since, not noticed yet
    noticed: int = 0  # noticed one at a time in this window


class Notices:
    def __init__(
        self,
        window_s: float = WINDOW_S,
        *,
        burst: int = 1,
        max_keys: int = MAX_KEYS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window_s = window_s
        self.burst = burst
        self.max_keys = max_keys
        self.clock = clock
        self._keys: OrderedDict[str, _Key] = OrderedDict()

    def note(self, key: str, count: int = 1) -> Notice | None:
        """Count `count` refusals of `key`: the notice to make now, or None (counted into
        the next one)."""
        now = self.clock()
        entry = self._keys.get(key)
        if entry is None:
            self._keys[key] = _Key(noticed_at=now, noticed=1)
            self._trim()
            return Notice(key, count, 0.0)
        self._keys.move_to_end(key)
        quiet = now - entry.noticed_at >= self.window_s
        if quiet and entry.pending == 0:  # a window without refusals: as a new key
            entry.noticed_at, entry.noticed = now, 1
            return Notice(key, count, 0.0)
        if entry.noticed < self.burst and not quiet:
            entry.noticed += 1
            return Notice(key, count, 0.0)
        entry.pending += count
        return self._due(key, entry, now)

    def due(self) -> list[Notice]:
        """The notices whose window has passed with refusals counted and not noticed (a
        flood that stopped is still told, at the next look)."""
        now = self.clock()
        out = []
        for key, entry in list(self._keys.items()):
            notice = self._due(key, entry, now)
            if notice is not None:
                out.append(notice)
        return out

    def _due(self, key: str, entry: _Key, now: float) -> Notice | None:
        if entry.pending <= 0 or now - entry.noticed_at < self.window_s:
            return None
        notice = Notice(key, entry.pending, now - entry.noticed_at)
        entry.noticed_at, entry.pending, entry.noticed = now, 0, self.burst
        return notice

    def _trim(self) -> None:
        while len(self._keys) > self.max_keys:
            self._keys.popitem(last=False)
