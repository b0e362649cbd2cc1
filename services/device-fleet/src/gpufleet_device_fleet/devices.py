"""An account's devices (R-DEV-1, R-NODE-3): add, show, list, set a configuration, remove,
a join token; `DeviceAdded` / `DeviceRemoved` in the same transaction (outbox), for billing's
daily fee (R-BILL-3). Touches the database and the outbox; asks the provisioner."""

from __future__ import annotations

import uuid
from datetime import datetime

from gpufleet_bus import emit
from gpufleet_contracts.clock import Clock
from gpufleet_contracts.datastores import NodeFacts
from gpufleet_contracts.devices import (
    AddDevice,
    DeviceAdded,
    DeviceConfigsTold,
    DeviceList,
    DeviceRemoved,
    DeviceState,
    DeviceTokenIssued,
    DeviceView,
    RegionDevices,
)
from gpufleet_contracts.errors import NotFound, Refused
from gpufleet_store import Doc, Store, Transaction, now_ms
from gpufleet_store.duplicates import colliding_key
from pymongo import ASCENDING, IndexModel
from pymongo.errors import DuplicateKeyError

from .regions import RegionPort
from .rules import check_region
from .views import configs_told, device_view

INDEXES = {
    # `name_key` / `minion_key` hold the live device's keys; a removed device's are its id,
    # so its name and minion id can be used again.
    "devices": [
        IndexModel([("name_key", ASCENDING)], unique=True),
        IndexModel([("minion_key", ASCENDING)], unique=True),
        IndexModel([("owner", ASCENDING), ("region", ASCENDING)]),
        IndexModel([("region_id", ASCENDING)]),
    ],
}


class Devices:
    def __init__(self, store: Store, clock: Clock, regions: RegionPort) -> None:
        self.store = store
        self.db = store.db
        self.clock = clock
        self.regions = regions

    async def find(self, account: str, ref: str, tx: Transaction | None = None) -> Doc:
        """The account's live device named `ref` (name, minion id or device id); another
        account's is not found (R-TEN-2)."""
        doc: Doc | None = await self.db.devices.find_one(
            {
                "owner": account,
                "state": {"$ne": DeviceState.removed.value},
                "$or": [{"name": ref}, {"minion_id": ref}, {"_id": ref}],
            },
            session=tx.session if tx else None,
        )
        if doc is None:
            raise NotFound(f"device {ref!r} not found")
        return doc

    async def add(self, body: AddDevice, account: str) -> DeviceView:
        facts = await self.regions.facts(account, body.region)
        check_region(body.region, facts)
        now = self.clock()
        device_id = uuid.uuid4().hex
        doc: Doc = {
            "_id": device_id,
            "owner": account,
            "region": body.region,
            "region_id": facts.region_id,
            "name": body.name,
            "minion_id": body.minion_id,
            "model": body.model.value,
            "state": DeviceState.provisioning.value,
            "config": None,
            "name_key": f"{facts.region_id}/{body.name}",
            "minion_key": body.minion_id,
            "added_at_ms": now_ms(now),
        }

        async def tx_body(tx: Transaction) -> None:
            await self.db.devices.insert_one(doc, session=tx.session)
            emit(
                tx,
                DeviceAdded(
                    device_id=device_id,
                    account=account,
                    region=body.region,
                    model=body.model.value,
                    at=now,
                ),
                msg_id=f"device-added:{device_id}",
            )

        try:
            await self.store.transaction(tx_body)
        except DuplicateKeyError as exc:
            key = await colliding_key(exc, self.db.devices, doc, (("name_key",), ("minion_key",)))
            if key is None:
                raise
            which = "name" if key == 0 else "minion_id"
            says = (
                f"a device named {body.name!r} is already in region {body.region!r}"
                if which == "name"
                else f"minion id {body.minion_id!r} is already a device's"
            )
            raise Refused.of_field(
                "conflict", says, field=which, rule="R-DEV-1", says="already in use"
            ) from None
        return device_view(doc, now)

    async def show(self, account: str, ref: str) -> DeviceView:
        return device_view(await self.find(account, ref), self.clock())

    async def list(self, account: str, region: str | None, include_removed: bool) -> DeviceList:
        query: Doc = {"owner": account}
        if region is not None:
            query["region"] = region
        if not include_removed:
            query["state"] = {"$ne": DeviceState.removed.value}
        docs = await self.db.devices.find(query).sort([("region", 1), ("name", 1)]).to_list(None)
        now = self.clock()
        return DeviceList(devices=[device_view(d, now) for d in docs])

    async def remove(self, account: str, ref: str) -> DeviceView:
        now = self.clock()

        async def tx_body(tx: Transaction) -> Doc:
            return await self.removed(tx, await self.find(account, ref, tx), now)

        return device_view(await self.store.transaction(tx_body), now)

    async def removed(self, tx: Transaction, doc: Doc, now: datetime) -> Doc:
        """The live device `doc` removed in `tx`, with its `DeviceRemoved` (billing's fee
        stops after its day; the provisioner revokes its enrolment); its keys are freed."""
        update = {
            "state": DeviceState.removed.value,
            "removed_at_ms": now_ms(now),
            "name_key": doc["_id"],
            "minion_key": doc["_id"],
        }
        await self.db.devices.update_one({"_id": doc["_id"]}, {"$set": update}, session=tx.session)
        emit(
            tx,
            DeviceRemoved(
                device_id=doc["_id"],
                account=doc["owner"],
                region=doc["region"],
                minion_id=doc["minion_id"],
                at=now,
            ),
            msg_id=f"device-removed:{doc['_id']}",
        )
        return {**doc, **update}

    async def remove_all(self, tx: Transaction, account: str, now: datetime) -> int:
        """Every live device of `account` removed in `tx` (its account was removed): how
        many. None is left to a redelivery, which removes nothing."""
        live = {"owner": account, "state": {"$ne": DeviceState.removed.value}}
        docs = await self.db.devices.find(live, session=tx.session).to_list(None)
        for doc in docs:
            await self.removed(tx, doc, now)
        return len(docs)

    async def token(self, account: str, ref: str, ttl_s: int) -> DeviceTokenIssued:
        """A one-time join token for the device (the provisioner signs its credential)."""
        doc = await self.find(account, ref)
        issued = await self.regions.join_token(account, doc["minion_id"], doc["region"], ttl_s)
        return DeviceTokenIssued(
            device=doc["name"],
            minion_id=issued.minion_id,
            region=issued.region,
            expires_at=issued.expires_at,
            token=issued.token,
        )

    async def count_in(self, region_id: str) -> RegionDevices:
        """The region's devices that are not removed (R-RES-1, asked by the datastore)."""
        n = await self.db.devices.count_documents(
            {"region_id": region_id, "state": {"$ne": DeviceState.removed.value}}
        )
        return RegionDevices(region_id=region_id, devices=n)

    async def facts(self, minion_id: str) -> NodeFacts:
        """Who the live device `minion_id` is, for the datastore service (NotFound: none).
        No sealing key: a device has none yet, so it mounts no SMB share."""
        doc = await self.db.devices.find_one({"minion_key": minion_id})
        if doc is None:
            raise NotFound(f"device {minion_id!r} not found")
        return NodeFacts(minion_id=minion_id, owner=doc["owner"], region=doc["region"])

    async def told(self, minion_id: str) -> DeviceConfigsTold:
        """The configurations the live device `minion_id` was told to run, for the scheduler
        sealing its attached keys (NotFound: no such device)."""
        doc = await self.db.devices.find_one({"minion_key": minion_id})
        if doc is None:
            raise NotFound(f"device {minion_id!r} not found")
        return configs_told(doc)
