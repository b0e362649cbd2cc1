"""Which unique key a write collided on: from the server's `keyPattern` where it gives one
(MongoDB does), else by looking the candidate keys up (nx-27017 names only its SQLite index,
docs/nx-27017-gaps.md). Never read from the error's text."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pymongo.asynchronous.collection import AsyncCollection
from pymongo.errors import DuplicateKeyError


def key_pattern(exc: DuplicateKeyError) -> frozenset[str] | None:
    """The fields of the unique index the write collided on, as the server says; None when
    it does not say."""
    pattern = (exc.details or {}).get("keyPattern")
    return frozenset(pattern) if isinstance(pattern, Mapping) and pattern else None


async def colliding_key(
    exc: DuplicateKeyError,
    coll: AsyncCollection[Any],
    doc: Mapping[str, Any],
    keys: Sequence[Sequence[str]],
) -> int | None:
    """The index in `keys` (each a unique index's fields) of the key `doc` collided on: the
    first whose fields the server names, or, when it names none, the first whose values
    another document holds; None when neither tells (the collision was on another key)."""
    named = key_pattern(exc)
    if named is not None:
        return next((i for i, k in enumerate(keys) if set(k) == named), None)
    for i, key in enumerate(keys):
        if await coll.find_one({f: doc[f] for f in key}, {"_id": 1}) is not None:
            return i
    return None
