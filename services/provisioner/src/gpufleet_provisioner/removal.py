"""Whether an account may be removed (R-TEN-1): what it still holds, judged as plain data.

An account owns its nodes (R-TEN-1); removing it while one is still in the fleet would leave
a machine serving an account nobody can speak for any more, so that removal is refused with
the nodes named, and the operator removes them first (their workers are requeued). The
account's document stays as a tombstone (`removed_at_ms`), so its name, under which its jobs
and ledger entries remain, is never given to another tenant.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpufleet_contracts.errors import NotFound, Refused

RULE = "R-TEN-1"
SHOWN = 5  # holdings named in a refusal; the rest are counted


@dataclass(frozen=True)
class Holdings:
    """What an account still holds in the provisioner's records."""

    nodes: tuple[str, ...] = ()  # minion ids of its nodes not removed


def _named(ids: Sequence[str]) -> str:
    shown = ", ".join(sorted(ids)[:SHOWN])
    more = len(ids) - SHOWN
    return f"{shown} and {more} more" if more > 0 else shown


def removed(doc: dict[str, Any] | None) -> bool:
    """Whether a stored account is a tombstone."""
    return doc is not None and doc.get("removed_at_ms") is not None


def check_removal(account: str, doc: dict[str, Any] | None, holdings: Holdings) -> None:
    """Raise unless `account` (its stored document `doc`) may be removed now: an unknown or
    already removed account is not found; one still holding nodes is a `conflict` naming
    them (the operator removes them first, which requeues their workers)."""
    if doc is None or removed(doc):
        raise NotFound(f"no account {account!r}")
    if holdings.nodes:
        says = f"still has {len(holdings.nodes)} node(s): {_named(holdings.nodes)}"
        raise Refused.of_field(
            "conflict",
            f"account {account!r} cannot be removed: it {says}",
            field="account",
            rule=RULE,
            says=says,
            valid="remove its nodes first (`gpufleet node remove`)",
        )
