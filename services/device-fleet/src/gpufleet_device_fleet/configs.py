"""Device configurations (R-DEV-2): per region of the acting account, a name unique in its
region and reusable in another; a device runs one at a time, many devices may share one.
Touches the database only."""

from __future__ import annotations

from gpufleet_contracts.clock import Clock
from gpufleet_contracts.devices import (
    AddDeviceConfig,
    DeviceConfigList,
    DeviceConfigSpec,
    DeviceConfigView,
    DeviceState,
    DeviceView,
)
from gpufleet_contracts.errors import NotFound, Refused
from gpufleet_store import Doc, Store, Transaction, now_ms
from pymongo import ASCENDING, IndexModel
from pymongo.errors import DuplicateKeyError

from .devices import Devices
from .regions import RegionPort
from .rules import check_config, check_region
from .views import config_view, device_view

INDEXES = {
    "device_configs": [
        IndexModel([("owner", ASCENDING), ("region", ASCENDING), ("name", ASCENDING)], unique=True)
    ],
}
LIVE = {"$ne": DeviceState.removed.value}


class Configs:
    def __init__(self, store: Store, clock: Clock, regions: RegionPort, devices: Devices) -> None:
        self.store = store
        self.db = store.db
        self.clock = clock
        self.regions = regions
        self.devices = devices

    async def find(
        self, account: str, region: str, name: str, tx: Transaction | None = None
    ) -> Doc:
        doc: Doc | None = await self.db.device_configs.find_one(
            {"owner": account, "region": region, "name": name},
            session=tx.session if tx else None,
        )
        if doc is None:
            raise NotFound(f"device configuration {name!r} not found in region {region!r}")
        return doc

    async def _users(self, account: str, region: str, name: str) -> int:
        query = {"owner": account, "region": region, "config": name, "state": LIVE}
        return int(await self.db.devices.count_documents(query))

    async def add(self, body: AddDeviceConfig, account: str) -> DeviceConfigView:
        facts = await self.regions.facts(account, body.region)
        check_region(body.region, facts)
        spec = check_config(DeviceConfigSpec.model_validate(body.model_dump(include=_SPEC)))
        doc: Doc = {
            "owner": account,
            "region": body.region,
            "region_id": facts.region_id,
            "name": body.name,
            "spec": spec.model_dump(mode="json"),
            "created_at_ms": now_ms(self.clock()),
        }
        try:
            await self.db.device_configs.insert_one(doc)
        except DuplicateKeyError:
            raise Refused.of_field(
                "conflict",
                f"region {body.region!r} already has a device configuration {body.name!r}",
                field="name",
                rule="R-DEV-2",
                says="unique within its region",
            ) from None
        return config_view(doc)

    async def show(self, account: str, region: str, name: str) -> DeviceConfigView:
        doc = await self.find(account, region, name)
        return config_view(doc, await self._users(account, region, name))

    async def list(self, account: str, region: str | None) -> DeviceConfigList:
        query: Doc = {"owner": account}
        if region is not None:
            query["region"] = region
        docs = (
            await self.db.device_configs.find(query)
            .sort([("region", 1), ("name", 1)])
            .to_list(None)
        )
        return DeviceConfigList(
            configs=[
                config_view(d, await self._users(account, d["region"], d["name"])) for d in docs
            ]
        )

    async def remove(self, account: str, region: str, name: str) -> DeviceConfigView:
        async def tx_body(tx: Transaction) -> Doc:
            doc = await self.find(account, region, name, tx)
            users = await self.db.devices.count_documents(
                {"owner": account, "region": region, "config": name, "state": LIVE},
                session=tx.session,
            )
            if users:
                raise Refused(
                    "conflict",
                    f"device configuration {name!r} is set on {users} device(s): set another "
                    "on them first",
                )
            await self.db.device_configs.delete_one({"_id": doc["_id"]}, session=tx.session)
            return doc

        return config_view(await self.store.transaction(tx_body))

    async def set_on(self, account: str, ref: str, name: str | None) -> DeviceView:
        """The configuration device `ref` runs from now on (its own region's; None: none);
        it takes effect when it is deployed."""

        async def tx_body(tx: Transaction) -> Doc:
            device = await self.devices.find(account, ref, tx)
            if name is not None:
                try:
                    await self.find(account, device["region"], name, tx)
                except NotFound:
                    raise Refused.of_field(
                        "not_found",
                        f"no device configuration {name!r} in the device's region "
                        f"{device['region']!r}",
                        field="config",
                        rule="R-DEV-2",
                        says="not a configuration of the device's region",
                    ) from None
            await self.db.devices.update_one(
                {"_id": device["_id"]}, {"$set": {"config": name}}, session=tx.session
            )
            return {**device, "config": name}

        return device_view(await self.store.transaction(tx_body), self.clock())


_SPEC = set(DeviceConfigSpec.model_fields)
