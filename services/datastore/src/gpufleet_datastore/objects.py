"""The `platform_objects` collection: an account's datasets, models and checkpoints, their
state (`uploading` until the store holds the bytes, then `ready`) and where the bytes are.
Another account's object is "not found" unless it is public and ready, and even then only
read, never removed or written."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

from gpufleet_contracts.errors import NotFound, Refused
from gpufleet_contracts.locations import PlatformAsset
from gpufleet_contracts.platform import (
    CompletePlatformObject,
    GrantPlatformObject,
    PlatformGrant,
    PlatformObjectView,
)
from pymongo import ASCENDING, DESCENDING, IndexModel
from pymongo.errors import DuplicateKeyError

from .bucket import Granted
from .naming import addressed, checked, object_key, output_name

COLLECTION = "platform_objects"
INDEXES = {
    COLLECTION: [
        IndexModel(
            [("account", ASCENDING), ("asset", ASCENDING), ("name", ASCENDING)], unique=True
        ),
        IndexModel([("public", ASCENDING), ("asset", ASCENDING), ("created_at", DESCENDING)]),
        IndexModel([("job_id", ASCENDING), ("worker", ASCENDING), ("asset", ASCENDING)]),
    ]
}
NAME_TRIES = 20  # another writer took the name chosen: choose again


def view(doc: dict[str, Any]) -> PlatformObjectView:
    return PlatformObjectView.model_validate(doc)


class PlatformObjects(Granted):
    COLLECTION = COLLECTION

    # --- an account's reads and removals ------------------------------------------------

    async def list(
        self, account: str, asset: PlatformAsset, public: bool, limit: int
    ) -> list[PlatformObjectView]:
        query: dict[str, Any] = (
            {"public": True, "asset": asset.value, "state": "ready"}
            if public
            else {"account": account, "asset": asset.value}
        )
        found = self.coll.find(query).sort("created_at", DESCENDING).limit(limit)
        return [view(d) async for d in found]

    async def readable(self, account: str, asset: PlatformAsset, name: str) -> dict[str, Any]:
        """The object `account` may read by `name` (its own, or `<owner>/<name>` public and
        ready), or NotFound alike for one that does not exist and one that is not its."""
        owner, own_name = addressed(name, account)
        doc = await self.coll.find_one({"account": owner, "asset": asset.value, "name": own_name})
        if doc is None or (owner != account and not (doc["public"] and doc["state"] == "ready")):
            raise NotFound(f"no {asset.value} {name}")
        return doc

    async def get(self, account: str, asset: PlatformAsset, name: str) -> PlatformObjectView:
        return view(await self.readable(account, asset, name))

    async def remove(self, account: str, asset: PlatformAsset, name: str) -> PlatformObjectView:
        """Remove the acting account's own object (never another's, public or not)."""
        doc = await self.coll.find_one(
            {"account": account, "asset": asset.value, "name": checked(name)}
        )
        if doc is None:
            raise NotFound(f"no {asset.value} {name}")
        if self.bucket is not None:
            await self.bucket.remove(doc["key"])
        await self.coll.delete_one({"_id": doc["_id"]})
        return view(doc)

    # --- the scheduler's, for a placement of `account`'s job -------------------------------

    async def grant(self, body: GrantPlatformObject) -> PlatformGrant:
        self._bucket()
        method: Literal["GET", "PUT"]
        if body.mode == "read":
            doc = await self.readable(body.account, body.asset, body.name)
            if doc["state"] != "ready":
                raise Refused("conflict", f"{body.asset.value} {body.name} is still uploading")
            method = "GET"
        else:
            doc = await self._new(body)
            method = "PUT"
        url, expires_at = self.presigned(doc["key"], method)
        return PlatformGrant(
            account=doc["account"],
            asset=body.asset,
            name=doc["name"],
            method=method,
            url=url,
            expires_at=expires_at,
        )

    async def _new(self, body: GrantPlatformObject) -> dict[str, Any]:
        """The `uploading` record of this worker's output: the one made by an earlier grant of
        the same worker (a node's retry), or a new one named after the job."""
        mine = {"account": body.account, "asset": body.asset.value}
        earlier = await self.coll.find_one(
            {**mine, "job_id": body.job_id, "worker": body.worker, "state": "uploading"}
        )
        if earlier is not None:
            return earlier
        base = checked(body.name)
        for _ in range(NAME_TRIES):
            taken = await self.coll.distinct("name", {**mine, "name": {"$regex": _prefix(base)}})
            doc = {
                "_id": uuid.uuid4().hex,
                **mine,
                "name": output_name(base, taken),
                "key": object_key(body.account, body.asset),
                "size": None,
                "sha256": None,
                "state": "uploading",
                "public": body.public,
                "job_id": body.job_id,
                "worker": body.worker,
                "created_at": self.clock(),
                "ready_at": None,
            }
            try:
                await self.coll.insert_one(doc)
            except DuplicateKeyError:
                continue
            return doc
        raise Refused("conflict", f"no free name for {base}: try again")

    async def complete(self, body: CompletePlatformObject) -> PlatformObjectView:
        """Mark the job's upload ready with the size and checksum the store reports."""
        bucket = self._bucket()
        doc = await self.coll.find_one(
            {
                "account": body.account,
                "asset": body.asset.value,
                "name": body.name,
                "job_id": body.job_id,
            }
        )
        if doc is None:
            raise NotFound(f"no {body.asset.value} {body.name} of job {body.job_id}")
        if doc["state"] == "ready":
            return view(doc)
        stored = await bucket.stored(doc["key"])
        if stored is None:
            raise Refused("conflict", f"{body.asset.value} {body.name}: nothing was put")
        sha = stored.sha256 or await bucket.sha256(doc["key"])
        done: datetime = self.clock()
        update = {"state": "ready", "size": stored.size, "sha256": sha, "ready_at": done}
        await self.coll.update_one({"_id": doc["_id"]}, {"$set": update})
        return view({**doc, **update})


def _prefix(base: str) -> str:
    import re

    return f"^{re.escape(base)}(-[0-9]+)?$"
