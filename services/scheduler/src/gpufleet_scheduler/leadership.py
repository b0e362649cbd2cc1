"""One scheduler places at a time: a lease in the database, and its epoch as fencing token.

The lease is one document `{_id: "scheduler", owner, epoch, renewals, ttl_ms}` in `leases`.
An instance takes it when it is free or expired, with a conditional update on the owner,
epoch and renewal count it read (a compare-and-set: of two instances racing, one matches
and the other does not), and each new holder increments the epoch. The holder renews it
every `ttl/3`, counting `renewals` up.

Expiry is judged on durations, never on a wall-clock time written by another host (issue
16: a standby whose clock ran an hour ahead took a live leader's lease at once, and a
leader whose clock ran an hour ahead left a lease that outlived it by an hour). Each
instance measures on its own monotonic clock, which cannot be stepped:
- the waiter: the lease is expired once the document (owner, epoch, renewals) has stayed
  unchanged for the holder's `ttl_ms` since this instance first read it that way;
- the holder: it leads until `ttl` after it *started* its last successful renewal.
The holder's term starts before its write and the waiter's count after it has read that
write, so the holder's belief ends before any waiter may take over, whatever the offset
between their clocks (only a rate difference above `ttl`'s margin could break it; clocks
drift by parts per million). The cost: a standby that starts while a dead holder's lease
is in the document waits one full TTL before taking it (the document cannot say how old
it is). A released lease (`released: true`) is free at once.

Fencing: every transaction that places work first updates the lease document on
`{owner: me, epoch: my epoch}` inside the same transaction. A deposed instance (its lease
expired and another took it, e.g. after a long pause) matches nothing and its transaction
aborts, so it can never give away a GPU; and because both write the lease document, two
placement transactions cannot interleave unnoticed (a write conflict on MongoDB, a
serialised transaction on nx-27017). Claims also carry the epoch that made them.

Restarting in place. An instance has an identity (`owner`): the service uses its host name
(a container's survives its restarts; `GPUFLEET_SCHEDULER_INSTANCE` overrides it, e.g. with a
pod's name). A process that starts under the name the lease holds is that holder come
back after a crash: it takes the lease at once, with the next epoch, instead of waiting out
the dead process's term (up to the TTL, 10 s). It does so once, at its first attempt: were
the name not unique after all, the process already running loses the lease (its fenced
transactions fail from then on, so no GPU is given twice) and does not take it back.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError

log = logging.getLogger("gpufleet.scheduler.leader")

LEASE_ID = "scheduler"


class Deposed(Exception):
    """This instance no longer holds the lease; what it was doing is abandoned."""


def wall_ms() -> int:
    """Wall-clock ms: written for people reading the document, never compared."""
    return int(time.time() * 1000)


@dataclass
class Seen:
    """The lease document as a waiter last read it, and when (its monotonic ms)."""

    key: tuple[str, int, int]  # owner, epoch, renewals: changes with every renewal
    since_ms: int


def lease_key(doc: dict[str, Any]) -> tuple[str, int, int]:
    return (str(doc["owner"]), int(doc["epoch"]), int(doc.get("renewals", 0)))


def lease_free(doc: dict[str, Any], seen: Seen | None, now_ms: int, ttl_ms: int) -> bool:
    """Whether a waiter may take the lease: released, or unchanged for the holder's TTL on
    the waiter's own clock since it first read it so (`seen`, already brought up to date)."""
    if doc.get("released") or doc.get("expires_ms") == 0:  # 0: released by an older version
        return True
    if seen is None or seen.key != lease_key(doc):
        return False
    return now_ms - seen.since_ms >= int(doc.get("ttl_ms") or ttl_ms)


def monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


class Lease:
    def __init__(
        self,
        db: AsyncDatabase[dict[str, Any]],
        ttl_ms: int = 10_000,
        owner: str | None = None,
        now_ms: Callable[[], int] = monotonic_ms,
    ) -> None:
        """`now_ms`: this instance's clock; only its differences are used (monotonic: a
        stepped wall clock changes nothing, and two hosts' readings need not agree)."""
        self.coll = db["leases"]
        self.ttl_ms = ttl_ms
        self.owner = owner or uuid.uuid4().hex[:12]
        self.now_ms = now_ms
        self.epoch: int | None = None  # set while this instance believes it leads
        self.expires_ms = 0  # on our clock: `ttl` after our last renewal started
        self._renewals = 0  # the renewal count we last wrote
        self._seen: Seen | None = None  # the document as a waiter read it (module doc)
        self._first_attempt = True  # a holder of our name is us, restarted (module doc)

    @property
    def held(self) -> bool:
        return self.epoch is not None and self.now_ms() < self.expires_ms

    def fresh(self) -> bool:
        """Held, with more than two thirds of the term left (no need to renew yet)."""
        return self.held and self.expires_ms - self.now_ms() > self.ttl_ms * 2 // 3

    async def acquire(self) -> bool:
        """Take or renew the lease; True while held. Never blocks on another holder."""
        now = self.now_ms()
        first, self._first_attempt = self._first_attempt, False
        doc = await self.coll.find_one({"_id": LEASE_ID})
        if doc is None:
            try:
                await self.coll.insert_one(
                    {
                        "_id": LEASE_ID,
                        "owner": self.owner,
                        "epoch": 1,
                        "renewals": 0,
                        "ttl_ms": self.ttl_ms,
                        "renewed_at": wall_ms(),
                    }
                )
            except DuplicateKeyError:
                return False
            return self._won(1, 0, now)
        key = lease_key(doc)
        if self._seen is None or self._seen.key != key:
            self._seen = Seen(key, self.now_ms())  # after the read: never early
        restarted = first and doc["owner"] == self.owner
        # Ours as we last wrote it: renewed even after our term lapsed (a long pass), as
        # no one took it meanwhile; a waiter racing us on the same key loses the CAS or wins.
        mine = key == (self.owner, self.epoch, self._renewals)
        if not mine and not restarted and not lease_free(doc, self._seen, now, self.ttl_ms):
            self.epoch = None
            return False
        epoch = doc["epoch"] if mine else doc["epoch"] + 1
        renewals = int(doc.get("renewals", 0)) + 1
        match = {"_id": LEASE_ID, "epoch": doc["epoch"], "owner": doc["owner"]}
        match["renewals"] = doc.get("renewals", {"$exists": False})  # an older version's
        res = await self.coll.update_one(
            match,
            {
                "$set": {
                    "owner": self.owner,
                    "epoch": epoch,
                    "renewals": renewals,
                    "ttl_ms": self.ttl_ms,
                    "renewed_at": wall_ms(),  # for people reading it; never compared
                    "released": False,
                },
                "$unset": {"expires_ms": ""},
            },
        )
        if res.matched_count != 1:
            self.epoch = None
            return False
        return self._won(epoch, renewals, now)

    def _won(self, epoch: int, renewals: int, now: int) -> bool:
        if self.epoch != epoch:
            log.info("scheduler %s leads (epoch %s)", self.owner, epoch)
        self.epoch = epoch
        self._renewals = renewals
        self.expires_ms = now + self.ttl_ms
        return True

    async def fence(self, session: AsyncClientSession) -> int:
        """Inside a transaction: fail unless this instance still holds the lease."""
        if self.epoch is None:
            raise Deposed(f"{self.owner} does not lead")
        res = await self.coll.update_one(
            {"_id": LEASE_ID, "owner": self.owner, "epoch": self.epoch},
            {"$set": {"fenced_ms": wall_ms()}},
            session=session,
        )
        if res.matched_count != 1:
            self.epoch = None
            raise Deposed(f"{self.owner} lost the lease")
        return self.epoch

    async def release(self) -> None:
        if self.epoch is not None:
            await self.coll.update_one(
                {"_id": LEASE_ID, "owner": self.owner, "epoch": self.epoch},
                {"$set": {"released": True}},
            )
        self.epoch = None
