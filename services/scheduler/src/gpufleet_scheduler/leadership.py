"""One scheduler places at a time: a lease in the database, and its epoch as fencing token.

The lease is one document `{_id: "scheduler", owner, epoch, expires_ms}` in `leases`. An
instance takes it when it is free or expired, with a conditional update on the epoch it
read (a compare-and-set: of two instances racing, one matches and the other does not), and
each new holder increments the epoch. The holder renews it every `ttl/3`.

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
from typing import Any

from pymongo.asynchronous.client_session import AsyncClientSession
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError

log = logging.getLogger("gpufleet.scheduler.leader")

LEASE_ID = "scheduler"


class Deposed(Exception):
    """This instance no longer holds the lease; what it was doing is abandoned."""


def wall_ms() -> int:
    return int(time.time() * 1000)


class Lease:
    def __init__(
        self,
        db: AsyncDatabase[dict[str, Any]],
        ttl_ms: int = 10_000,
        owner: str | None = None,
        now_ms: Callable[[], int] = wall_ms,
    ) -> None:
        self.coll = db["leases"]
        self.ttl_ms = ttl_ms
        self.owner = owner or uuid.uuid4().hex[:12]
        self.now_ms = now_ms
        self.epoch: int | None = None  # set while this instance believes it leads
        self.expires_ms = 0
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
                        "expires_ms": now + self.ttl_ms,
                    }
                )
            except DuplicateKeyError:
                return False
            return self._won(1, now)
        restarted = first and doc["owner"] == self.owner
        mine = doc["owner"] == self.owner and doc["epoch"] == self.epoch
        if not mine and not restarted and doc["expires_ms"] > now:
            self.epoch = None
            return False
        epoch = doc["epoch"] if mine else doc["epoch"] + 1
        res = await self.coll.update_one(
            {"_id": LEASE_ID, "epoch": doc["epoch"], "owner": doc["owner"]},
            {"$set": {"owner": self.owner, "epoch": epoch, "expires_ms": now + self.ttl_ms}},
        )
        if res.matched_count != 1:
            self.epoch = None
            return False
        return self._won(epoch, now)

    def _won(self, epoch: int, now: int) -> bool:
        if self.epoch != epoch:
            log.info("scheduler %s leads (epoch %s)", self.owner, epoch)
        self.epoch = epoch
        self.expires_ms = now + self.ttl_ms
        return True

    async def fence(self, session: AsyncClientSession) -> int:
        """Inside a transaction: fail unless this instance still holds the lease."""
        if self.epoch is None:
            raise Deposed(f"{self.owner} does not lead")
        res = await self.coll.update_one(
            {"_id": LEASE_ID, "owner": self.owner, "epoch": self.epoch},
            {"$set": {"fenced_ms": self.now_ms()}},
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
                {"$set": {"expires_ms": 0}},
            )
        self.epoch = None
