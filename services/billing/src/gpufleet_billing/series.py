"""An account's spending and earnings summed per period: the console's charts, exact."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from .fees import MS_PER_HOUR

MS_PER_DAY = 24 * MS_PER_HOUR
PERIOD_MS = {"hour": MS_PER_HOUR, "day": MS_PER_DAY}


@dataclass(frozen=True)
class Movement:
    """One ledger entry as the series reads it: when, how much, and whose side."""

    at_ms: int
    amount_micro: int
    earning: bool  # an entry of the account's earnings (not of its credits)
    payout: bool = False


@dataclass(frozen=True)
class Sums:
    start_ms: int
    spent_micro: int
    earned_micro: int

    @property
    def start(self) -> str:
        return datetime.fromtimestamp(self.start_ms / 1000, UTC).isoformat()


def summed(movements: Iterable[Movement], period: str, limit: int) -> list[Sums]:
    """Per `period` (hour, day: UTC), what was spent (charges to the account, as a positive
    amount; credits added are not spending) and earned (earnings, payouts left out); only
    periods with such an entry, oldest first, the newest `limit` of them."""
    size = PERIOD_MS[period]
    spent: dict[int, int] = {}
    earned: dict[int, int] = {}
    for m in movements:
        start = m.at_ms - m.at_ms % size
        if m.earning and not m.payout:
            earned[start] = earned.get(start, 0) + m.amount_micro
        elif not m.earning and m.amount_micro < 0:
            spent[start] = spent.get(start, 0) - m.amount_micro
    starts = sorted(set(spent) | set(earned))[-limit:]
    return [Sums(s, spent.get(s, 0), earned.get(s, 0)) for s in starts]
