"""Settling a charge to its target, pure.

Every charge belongs to a group with a stable key derived from what caused it
(`market:<placement>`, `devicefee:<account>:<day>`, `payout:<account>:<day>`). The service
computes the group's *target* postings from everything it knows, and posts only the difference
from what the ledger already holds for the group, as a new stage of entries with keys
`<group>:<stage>:<account>`. Replaying an event recomputes the same target and posts nothing;
an event learned late (a run that ended before hours the clock already billed, a device added
to a day already charged) posts the exact correction. The entries of a stage sum to zero,
because both the target and what was posted do.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .fees import Posting


@dataclass(frozen=True)
class Posted:
    """One entry already in the ledger, as settling sees it."""

    account: str
    amount_micro: int
    stage: str
    kind: str = ""


def by_account(postings: Iterable[Posting | Posted]) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in postings:
        out[p.account] = out.get(p.account, 0) + p.amount_micro
    return out


def delta(target: list[Posting], posted: Iterable[Posted]) -> list[Posting]:
    """The postings that bring the group from `posted` to `target` (zero-valued ones dropped).

    The first stage of a group posts its target even when it is zero, so every run leaves its
    trace in the ledger.
    """
    posted = list(posted)
    if not posted:
        return list(target)
    have = by_account(posted)
    kinds = {p.account: p.kind for p in posted} | {p.account: p.kind for p in target}
    want = by_account(target)
    out = []
    for account in sorted(set(want) | set(have)):
        diff = want.get(account, 0) - have.get(account, 0)
        if diff:
            out.append(Posting(account, diff, kinds[account]))
    return out


def next_revision(posted: Iterable[Posted]) -> str:
    """Stage name for groups settled by revision: `r0`, `r1`, ..."""
    return f"r{len({p.stage for p in posted})}"


def entry_key(group: str, stage: str, account: str) -> str:
    return f"{group}:{stage}:{account}"


def balances(entries: Iterable[Posted | Posting]) -> Mapping[str, int]:
    return by_account(entries)
