"""The `relayed` collection: the files of jobs' `local` mounts on their way between the user's
machine and the node (gpufleet_contracts.localdata), in the platform bucket under
`local/<job_id>/`, each `uploading` until the store holds it, then `ready`, and removed
RELAY_DAYS after it was sent (`expire`). Only the scheduler asks, for the job's owner."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any, Literal

from gpufleet_contracts.errors import NotFound, Refused
from gpufleet_contracts.localdata import (
    RELAY_DAYS,
    CompleteRelay,
    GrantRelay,
    LocalStage,
    RelayedList,
    RelayedView,
    RelayGrant,
)
from pymongo import ASCENDING, IndexModel

from .bucket import Granted
from .naming import checked

COLLECTION = "relayed"
INDEXES = {COLLECTION: [IndexModel([("expires_at", ASCENDING)])]}
KEPT = timedelta(days=RELAY_DAYS)
EXPIRE_BATCH = 100


def relay_key(job_id: str, mount: str, worker: int, name: str) -> str:
    """Where a relayed file is in the bucket: under its job, its mount (a target's slashes
    made underscores) and worker, by its own name (which says how the node unpacks it)."""
    slug = re.sub(r"[^A-Za-z0-9._-]", "_", mount.strip("/")) or "_"
    return f"local/{job_id}/{slug}/{worker}/{name}"


def _id(body: GrantRelay | CompleteRelay) -> str:
    return f"{body.account}:{body.job_id}:{body.mount}:{body.worker}"


def view(doc: dict[str, Any]) -> RelayedView:
    return RelayedView.model_validate(doc)


class Relay(Granted):
    COLLECTION = COLLECTION

    def _grant(self, doc: dict[str, Any], method: Literal["GET", "PUT"]) -> RelayGrant:
        url, expires_at = self.presigned(doc["key"], method)
        return RelayGrant(
            mount=doc["mount"],
            name=doc["name"],
            method=method,
            url=url,
            expires_at=expires_at,
            size=doc.get("size"),
            sha256=doc.get("sha256"),
        )

    async def grant(self, body: GrantRelay) -> LocalStage:
        self._bucket()
        if body.mode == "read":
            doc = await self.coll.find_one({"_id": _id(body), "state": "ready"})
            if doc is None:
                return LocalStage(state="waiting")
            return LocalStage(state="ready", grant=self._grant(doc, "GET"))
        if body.name is None:
            raise Refused("invalid", "a relayed file to write is named")
        name = checked(body.name, "name")
        now = self.clock()
        doc = {
            "_id": _id(body),
            "account": body.account,
            "job_id": body.job_id,
            "mount": body.mount,
            "worker": body.worker,
            "name": name,
            "key": relay_key(body.job_id, body.mount, body.worker, name),
            "state": "uploading",
            "size": None,
            "sha256": None,
            "created_at": now,
            "expires_at": now + KEPT,
        }
        earlier = await self.coll.find_one_and_replace({"_id": doc["_id"]}, doc, upsert=True)
        if earlier is not None and earlier["key"] != doc["key"]:
            await self._bucket().remove(earlier["key"])  # another name sent before
        return LocalStage(state="uploading", grant=self._grant(doc, "PUT"))

    async def complete(self, body: CompleteRelay) -> RelayedView:
        bucket = self._bucket()
        doc = await self.coll.find_one({"_id": _id(body)})
        if doc is None:
            raise NotFound(f"nothing of job {body.job_id} is sent for {body.mount}")
        if doc["state"] == "ready":
            return view(doc)
        stored = await bucket.stored(doc["key"])
        if stored is None:
            raise Refused("conflict", f"{body.mount}: nothing was put")
        sha = stored.sha256 or await bucket.sha256(doc["key"])
        now = self.clock()
        update = {"state": "ready", "size": stored.size, "sha256": sha, "expires_at": now + KEPT}
        await self.coll.update_one({"_id": doc["_id"]}, {"$set": update})
        return view({**doc, **update})

    async def list(self, account: str, job_id: str) -> RelayedList:
        found = self.coll.find({"account": account, "job_id": job_id}).sort("_id", ASCENDING)
        return RelayedList(relayed=[view(d) async for d in found])

    async def expire(self) -> None:
        """Remove what was relayed RELAY_DAYS ago, its bytes first."""
        if self.bucket is None:
            return
        old = self.coll.find({"expires_at": {"$lt": self.clock()}}).limit(EXPIRE_BATCH)
        async for doc in old:
            await self.bucket.remove(doc["key"])
            await self.coll.delete_one({"_id": doc["_id"]})
