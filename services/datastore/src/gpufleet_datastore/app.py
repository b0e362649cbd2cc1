"""Composition root of datastore: its ports in, its Service out; every subject it handles is
in the one wiring table below.

Regional datastores and port reservations (R-RES-*) own their collections here and follow in
their own issues; platform objects (R-JOB-3, R-JOB-4) are served: an account's reads and
removals on its own subjects, the scheduler's grants of presigned URLs on `svc.datastore.*`,
which only the scheduler may publish (gpufleet_auth.permissions); so is the relay of jobs'
`local` data (relay.py), removed RELAY_DAYS after it was sent.
"""

from __future__ import annotations

from gpufleet_bus import Every, Ports, Request, Service, ServiceRuntime
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
from pydantic import SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict
from pymongo import ASCENDING, IndexModel

from . import objects, relay
from .bucket import Bucket
from .objects import PlatformObjects
from .relay import Relay

SERVICE = "datastore"

INDEXES = {
    "datastores": [
        IndexModel([("owner", ASCENDING), ("region", ASCENDING), ("name", ASCENDING)], unique=True)
    ],
    "reservations": [
        IndexModel([("owner", ASCENDING), ("region", ASCENDING), ("name", ASCENDING)], unique=True),
        IndexModel(
            [("region", ASCENDING), ("hostname", ASCENDING), ("port", ASCENDING)], unique=True
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


class Handlers:
    """Requests act for the account of their subject (R-TEN-2); the grants for the account
    the scheduler names, which it took from its own record of the placement's job."""

    def __init__(self, platform: PlatformObjects, relay: Relay) -> None:
        self.platform = platform
        self.relay = relay

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


def build_app(ports: Ports, settings: PlatformSettings | None = None) -> Service[PlatformObjects]:
    settings = settings or PlatformSettings()
    bucket = build_bucket(settings)
    platform = PlatformObjects(ports.db.db, bucket, ports.clock, settings.url_ttl_s)
    relayed = Relay(ports.db.db, bucket, ports.clock, settings.url_ttl_s)
    on = Handlers(platform, relayed)
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
        },
        every=[Every(EXPIRE_EVERY_S, relayed.expire, "relay-expiry", at_start=False)],
        prepare=[bucket.ensure] if bucket is not None and settings.create_bucket else [],
    )
    return rt.built(platform)
