"""A worker's staging progress (WorkerStaging) as one line a user reads: "downloading
s3://b/train.tar: 1.2 of 4.0 GB, 95 MB/s"; pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

WAITING = "waiting for you to connect"
VERBS = {"download": "downloading", "upload": "uploading"}
UNITS = ((10**12, "TB"), (10**9, "GB"), (10**6, "MB"), (10**3, "kB"))


def unit_of(n: int) -> tuple[int, str]:
    """The decimal unit that shows `n` bytes best."""
    for size, name in UNITS:
        if n >= size:
            return size, name
    return 1, "bytes"


def amount(n: int, size: int) -> str:
    return f"{n / size:.1f}" if size > 1 else str(n)


def line(item: Mapping[str, Any]) -> str:
    """One item: what is moved, where, how far and how fast."""
    done, total = int(item.get("done") or 0), item.get("total")
    size, unit = unit_of(int(total) if total else done)
    verb = VERBS.get(str(item.get("direction")), "downloading")
    if item.get("direction") == "upload":
        what = f"{verb} {item.get('name')} to {item.get('names')}"
    else:
        what = f"{verb} {item.get('names')}"
    far = (
        f"{amount(done, size)} of {amount(int(total), size)} {unit}"
        if total
        else f"{amount(done, size)} {unit}"
    )
    rate = int(item.get("rate") or 0)
    if rate:
        rsize, runit = unit_of(rate)
        far += f", {rate // rsize if rsize > 1 else rate} {runit}/s"
    return f"{what}: {far}"


def text(items: Iterable[Mapping[str, Any]]) -> str | None:
    """What a waiting item waits for (its reason: `waiting: datastore nas unreachable`), or
    WAITING when `local` data waits for the user to send it; else the items being moved
    now (`fetching`), or the first still to go, as one line; None when nothing is on its
    way."""
    items = list(items)
    held = [str(i["reason"]) for i in items if i.get("state") == "waiting" and i.get("reason")]
    if held:
        return "waiting: " + "; ".join(held)
    waiting = [
        str(i.get("names")) for i in items if i.get("state") == "waiting" and not i.get("reason")
    ]
    if waiting:
        return f"{WAITING} ({', '.join(waiting)}: gpufleet job connect)"
    moving = [i for i in items if i.get("state") == "fetching"]
    if moving:
        return "; ".join(line(i) for i in moving)
    pending = [i for i in items if i.get("state") == "pending"]
    if pending:
        return f"{line(pending[0])} (not begun)"
    return None
