"""The `datastores` collection: an account's regional datastores (R-RES-2), each in one of
its own regions (`region_id` `<owner>/<region>`), the SMB password sealed with the service's
key (`password_sealed`, a Fernet token) and never in a view or an event. Another account's
datastore answers "not found" like one that does not exist.

A node of the datastore's own region and owner may have it to mount (`mount`): the
provisioner says who the asking node is, and the password is sealed to that node's key
(gpufleet_auth.sealing), so the reply holds nothing another reader can open."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from gpufleet_auth import sealing
from gpufleet_bus.ask import Asker
from gpufleet_bus.publish import emit
from gpufleet_contracts.clock import Clock
from gpufleet_contracts.datastores import (
    AddDatastore,
    DatastoreAdded,
    DatastoreMount,
    DatastoreRemoved,
    DatastoreView,
    GetNodeFacts,
    MountDatastore,
    NodeFacts,
    SealedPassword,
)
from gpufleet_contracts.devices import GetDeviceFacts
from gpufleet_contracts.errors import Refused
from gpufleet_store import SecretBox, Store, Transaction
from pymongo.errors import DuplicateKeyError

from .inregion import InRegion
from .regionfacts import checked_region
from .shares import check_share

COLLECTION = "datastores"


def view(doc: dict[str, Any]) -> DatastoreView:
    return DatastoreView(
        name=doc["name"],
        region=doc["region"],
        region_id=doc["region_id"],
        type=doc["type"],
        address=doc["address"],
        root_path=doc["root_path"],
        mount_options=doc["mount_options"],
        username=doc.get("username"),
        password_set=doc.get("password_sealed") is not None,
        created_at=doc["created_at"],
    )


def datastore_id(owner: str, region: str, name: str) -> str:
    return f"{owner}/{region}/{name}"


class RegionalDatastores:
    """An account's datastores: added (after its region's facts), listed, shown, removed."""

    def __init__(self, store: Store, box: SecretBox, provisioner: Asker, clock: Clock) -> None:
        self.store = store
        self.records = InRegion(store, COLLECTION, "datastore", clock)
        self.coll = self.records.coll
        self.box = box
        self.provisioner = provisioner
        self.clock = clock

    async def add(self, account: str, body: AddDatastore) -> DatastoreView:
        check_share(body)
        facts = await checked_region(self.provisioner, account, body.region)
        now = self.clock()
        doc: dict[str, Any] = {
            "_id": datastore_id(account, body.region, body.name),
            "owner": account,
            "region": body.region,
            "region_id": facts.region_id,
            "name": body.name,
            "type": body.type.value,
            "address": body.address,
            "root_path": body.root_path,
            "mount_options": list(body.mount_options),
            "username": body.username,
            "password_sealed": (
                self.box.seal(body.password.get_secret_value().encode()).decode()
                if body.password is not None
                else None
            ),
            "created_at": now,
        }

        async def tx_body(tx: Transaction) -> None:
            try:
                await self.coll.insert_one(doc, session=tx.session)
            except DuplicateKeyError:
                raise Refused.of_field(
                    "conflict",
                    f"datastore {body.name!r} already exists in region {body.region!r}",
                    field="name",
                    rule="R-RES-2",
                    says="unique in its region",
                ) from None
            emit(
                tx,
                DatastoreAdded(
                    account=account,
                    region_id=facts.region_id,
                    name=body.name,
                    type=body.type,
                    at=now,
                ),
                msg_id=f"datastore-added:{doc['_id']}:{now.timestamp()}",
            )

        await self.store.transaction(tx_body)
        return view(doc)

    async def get(self, account: str, region: str, name: str) -> DatastoreView:
        return view(await self.records.own(account, region, name))

    async def list(self, account: str, region: str | None) -> list[DatastoreView]:
        return [view(d) for d in await self.records.docs(account, region)]

    async def remove(self, account: str, region: str, name: str) -> DatastoreView:
        def removed(doc: dict[str, Any], now: datetime) -> DatastoreRemoved:
            return DatastoreRemoved(account=account, region_id=doc["region_id"], name=name, at=now)

        return view(await self.records.remove(account, region, name, removed))

    async def _who(self, minion_id: str) -> NodeFacts:
        """The asking machine: a node the provisioner enrolled, else a device of
        device-fleet's (NotFound when neither knows it)."""
        try:
            return await self.provisioner(GetNodeFacts(minion_id=minion_id), NodeFacts)
        except Refused as exc:
            if exc.code != "not_found":
                raise
        return await self.provisioner(GetDeviceFacts(minion_id=minion_id), NodeFacts)

    async def mount(self, minion_id: str, body: MountDatastore) -> DatastoreMount:
        """The datastore `body.name` of the asking node's own region and owner, its SMB
        password sealed to that node; NotFound alike for another's and one that is not."""
        node = await self._who(minion_id)
        doc = await self.records.own(node.owner, node.region, body.name)
        password: SealedPassword | None = None
        sealed = doc.get("password_sealed")
        if sealed is not None:
            if not sealing.usable(node.sealing_key):
                raise Refused(
                    "conflict", f"node {minion_id} has no sealing key: it cannot mount SMB shares"
                )
            assert node.sealing_key is not None
            opened = self.box.open(sealed.encode())
            password = SealedPassword(
                key_id=sealing.key_id(node.sealing_key),
                box=sealing.seal(node.sealing_key, opened),
            )
        return DatastoreMount(
            name=doc["name"],
            region_id=doc["region_id"],
            type=doc["type"],
            address=doc["address"],
            root_path=doc["root_path"],
            mount_options=doc["mount_options"],
            username=doc.get("username"),
            password=password,
        )
