"""Composition root of datastore: its ports in, its Service out; every subject it handles is
in the one wiring table below.

Regional datastores (R-RES-2) are an account's own, in its own regions: added once the
provisioner said the region has a compute node or device and the account's plan allows it
(R-RES-1, R-TEN-3; regional.py, its rules in shares.py), their SMB passwords sealed with
GPUFLEET_SECRET_KEY. Port reservations (R-RES-3) own their collection here. Platform objects
(R-JOB-3, R-JOB-4) are served: an account's reads and removals on its own subjects, the
scheduler's grants of presigned URLs on `svc.datastore.*`, which only the scheduler may
publish (gpufleet_auth.permissions); so is the relay of jobs' `local` data (relay.py),
removed RELAY_DAYS after it was sent.
"""

from __future__ import annotations

from gpufleet_bus import Every, Ports, Request, Service, ServiceRuntime
from gpufleet_bus.ask import Asker
from gpufleet_contracts import subjects
from gpufleet_contracts.datastores import (
    AddDatastore,
    DatastoreAdded,
    DatastoreMount,
    DatastoreRemoved,
    Datastores,
    DatastoreView,
    GetDatastore,
    ListDatastores,
    MountDatastore,
    RemoveDatastore,
)
from gpufleet_contracts.localdata import (
    CompleteRelay,
    GrantRelay,
    ListRelayed,
    LocalStage,
    RelayedList,
    RelayedView,
)
from gpufleet_contracts.platform import (
    CompletePlatformObject,
    GetPlatformObject,
    GrantPlatformObject,
    ListPlatformObjects,
    PlatformGrant,
    PlatformObjectList,
    PlatformObjectView,
    RemovePlatformObject,
)
from gpufleet_contracts.reservations import (
    AddReservation,
    GetReservation,
    ListReservations,
    RemoveReservation,
    ReservationAdded,
    ReservationRemoved,
    Reservations,
    ReservationView,
)
from gpufleet_store import SecretBox
from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict
from pymongo import ASCENDING, IndexModel

from . import objects, relay
from .bucket import Bucket
from .objects import PlatformObjects
from .regional import RegionalDatastores
from .relay import Relay
from .reservations import PortReservations

SERVICE = "datastore"

INDEXES = {
    "datastores": [
        IndexModel([("owner", ASCENDING), ("region", ASCENDING), ("name", ASCENDING)], unique=True)
    ],
    "reservations": [
        IndexModel([("owner", ASCENDING), ("region", ASCENDING), ("name", ASCENDING)], unique=True),
        IndexModel(
            [
                ("owner", ASCENDING),
                ("region", ASCENDING),
                ("hostname", ASCENDING),
                ("port", ASCENDING),
            ],
            unique=True,
        ),
    ],
    **objects.INDEXES,
    **relay.INDEXES,
}
EXPIRE_EVERY_S = 3600.0


class PlatformSettings(BaseSettings):
    """The operator's S3-compatible bucket of platform objects. No bucket: platform objects
    are refused ("not configured"). The secret is a SecretStr: never in a repr or a log."""

    model_config = SettingsConfigDict(env_prefix="GPUFLEET_PLATFORM_", extra="ignore")
    s3_endpoint: str = ""  # empty: AWS; the nodes reach this host (the URLs are signed for it)
    bucket: str = ""
    access_key_id: str = ""
    secret_access_key: SecretStr = SecretStr("")
    region: str = "us-east-1"
    url_ttl_s: int = 3600  # how long a presigned URL is good for
    create_bucket: bool = False  # make a missing bucket at start (the devstack's)


class SecretSettings(BaseSettings):
    """The Fernet key sealing datastores' SMB passwords at rest (GPUFLEET_SECRET_KEY, the
    one the scheduler and provisioner share). None: a key of this process alone (in-process
    tests; what it sealed does not survive a restart)."""

    model_config = SettingsConfigDict(env_prefix="GPUFLEET_", extra="ignore")
    secret_key: str | None = Field(default=None, repr=False)

    def sealing_box(self) -> SecretBox:
        return SecretBox(self.secret_key) if self.secret_key else SecretBox.for_process()


class Handlers:
    """Requests act for the account of their subject (R-TEN-2); the grants for the account
    the scheduler names, which it took from its own record of the placement's job."""

    def __init__(
        self,
        platform: PlatformObjects,
        relay: Relay,
        datastores: RegionalDatastores,
        reservations: PortReservations,
    ) -> None:
        self.platform = platform
        self.relay = relay
        self.datastores = datastores
        self.reservations = reservations

    async def add_datastore(self, body: AddDatastore, account: str) -> DatastoreView:
        return await self.datastores.add(account, body)

    async def list_datastores(self, body: ListDatastores, account: str) -> Datastores:
        return Datastores(datastores=await self.datastores.list(account, body.region))

    async def get_datastore(self, body: GetDatastore, account: str) -> DatastoreView:
        return await self.datastores.get(account, body.region, body.name)

    async def remove_datastore(self, body: RemoveDatastore, account: str) -> DatastoreView:
        return await self.datastores.remove(account, body.region, body.name)

    async def add_reservation(self, body: AddReservation, account: str) -> ReservationView:
        return await self.reservations.add(account, body)

    async def list_reservations(self, body: ListReservations, account: str) -> Reservations:
        return Reservations(reservations=await self.reservations.list(account, body.region))

    async def remove_reservation(self, body: RemoveReservation, account: str) -> ReservationView:
        return await self.reservations.remove(account, body.region, body.name)

    async def node_reservation(self, body: GetReservation, subject: str) -> ReservationView:
        """A reservation of the asking node's region and owner, for it to publish."""
        return await self.reservations.for_node(subjects.node_rpc_node(subject) or "", body.name)

    async def mount_datastore(self, body: MountDatastore, subject: str) -> DatastoreMount:
        """A datastore of the asking node's region and owner (the subject names the node)."""
        return await self.datastores.mount(subjects.node_rpc_node(subject) or "", body)

    async def list_platform_objects(
        self, body: ListPlatformObjects, account: str
    ) -> PlatformObjectList:
        found = await self.platform.list(account, body.asset, body.public, body.limit)
        return PlatformObjectList(objects=found)

    async def get_platform_object(
        self, body: GetPlatformObject, account: str
    ) -> PlatformObjectView:
        return await self.platform.get(account, body.asset, body.name)

    async def remove_platform_object(
        self, body: RemovePlatformObject, account: str
    ) -> PlatformObjectView:
        return await self.platform.remove(account, body.asset, body.name)

    async def grant_platform_object(self, body: GrantPlatformObject) -> PlatformGrant:
        return await self.platform.grant(body)

    async def complete_platform_object(self, body: CompletePlatformObject) -> PlatformObjectView:
        return await self.platform.complete(body)

    async def grant_relay(self, body: GrantRelay) -> LocalStage:
        return await self.relay.grant(body)

    async def complete_relay(self, body: CompleteRelay) -> RelayedView:
        return await self.relay.complete(body)

    async def list_relayed(self, body: ListRelayed) -> RelayedList:
        return await self.relay.list(body.account, body.job_id)


def build_bucket(settings: PlatformSettings) -> Bucket | None:
    if not settings.bucket:
        return None
    return Bucket(
        settings.s3_endpoint,
        settings.bucket,
        settings.access_key_id,
        settings.secret_access_key,
        settings.region,
    )


def build_app(
    ports: Ports,
    settings: PlatformSettings | None = None,
    secrets: SecretSettings | None = None,
) -> Service[PlatformObjects]:
    settings = settings or PlatformSettings()
    bucket = build_bucket(settings)
    platform = PlatformObjects(ports.db.db, bucket, ports.clock, settings.url_ttl_s)
    relayed = Relay(ports.db.db, bucket, ports.clock, settings.url_ttl_s)
    provisioner = Asker(ports.broker)
    datastores = RegionalDatastores(
        ports.db, (secrets or SecretSettings()).sealing_box(), provisioner, ports.clock
    )
    reservations = PortReservations(ports.db, provisioner, ports.clock)
    on = Handlers(platform, relayed, datastores, reservations)
    rt = ServiceRuntime(SERVICE, ports, indexes=INDEXES)
    rt.wire(
        requests={
            "list_platform_objects": Request(
                on.list_platform_objects, description=ListPlatformObjects.__doc__
            ),
            "get_platform_object": Request(
                on.get_platform_object, description=GetPlatformObject.__doc__
            ),
            "remove_platform_object": Request(
                on.remove_platform_object, description=RemovePlatformObject.__doc__
            ),
            "add_datastore": Request(on.add_datastore, description=AddDatastore.__doc__),
            "list_datastores": Request(on.list_datastores, description=ListDatastores.__doc__),
            "get_datastore": Request(
                on.get_datastore, description="One of the account's datastores."
            ),
            "add_reservation": Request(on.add_reservation, description=AddReservation.__doc__),
            "list_reservations": Request(
                on.list_reservations, description="The account's port reservations."
            ),
            "remove_reservation": Request(
                on.remove_reservation, description="Remove one of the account's reservations."
            ),
            "remove_datastore": Request(
                on.remove_datastore, description="Remove one of the account's datastores."
            ),
        },
        direct={
            GrantPlatformObject.SUBJECT: Request(
                on.grant_platform_object, description=GrantPlatformObject.__doc__
            ),
            CompletePlatformObject.SUBJECT: Request(
                on.complete_platform_object, description=CompletePlatformObject.__doc__
            ),
            GrantRelay.SUBJECT: Request(on.grant_relay, description=GrantRelay.__doc__),
            CompleteRelay.SUBJECT: Request(on.complete_relay, description=CompleteRelay.__doc__),
            ListRelayed.SUBJECT: Request(on.list_relayed, description=ListRelayed.__doc__),
            subjects.as_node(GetReservation.SUBJECT, "*"): Request(
                on.node_reservation, description=GetReservation.__doc__
            ),
            subjects.as_node(MountDatastore.SUBJECT, "*"): Request(
                on.mount_datastore, description=MountDatastore.__doc__
            ),
        },
        every=[Every(EXPIRE_EVERY_S, relayed.expire, "relay-expiry", at_start=False)],
        publishes=[DatastoreAdded, DatastoreRemoved, ReservationAdded, ReservationRemoved],
        prepare=[bucket.ensure] if bucket is not None and settings.create_bucket else [],
    )
    return rt.built(platform)
