"""An account's providers and regions (PRODUCT.md section 2): the physical side here, the
Google Cloud side in `cloud` (a request naming `gcp` goes there).

An account enables a provider once (R-PROV-1) and creates regions: a physical one is a DNS
host name with a storage mode (R-REG-1), a GCP one a supported cloud region (R-REG-2).
"""

from __future__ import annotations

import re

from gpufleet_contracts.errors import Refused
from gpufleet_contracts.providers import (
    CreateRegion,
    EnableProvider,
    ListProviders,
    ListRegions,
    ProviderKind,
    Providers,
    ProviderView,
    Regions,
    RegionView,
)
from gpufleet_store import now_ms

from .cloud import CloudAccounts
from .records import Records, invalid, payment_mode
from .views import provider_view, region_view

REGION_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


class ProviderRequests:
    def __init__(self, records: Records, cloud: CloudAccounts) -> None:
        self.records = records
        self.db = records.db
        self.cloud = cloud

    async def enable_provider(self, body: EnableProvider, account: str) -> ProviderView:
        """Enable `physical` or `gcp` (with a service-account key) once (R-PROV-1/2)."""
        if body.provider == ProviderKind.physical:
            mode = payment_mode(body.payment_mode)
            return await self.records.enable(account, ProviderKind.physical, mode, {})
        if body.provider == ProviderKind.gcp:
            return await self.cloud.enable_gcp(account, body.payment_mode, body.key_json)
        raise Refused(
            "invalid",
            f"unknown provider {body.provider!r}",
            [
                {
                    "field": "provider",
                    "rule": "R-PROV-1",
                    "message": "unknown provider",
                    "valid": "physical | gcp",
                }
            ],
        )

    async def list_providers(self, body: ListProviders, account: str) -> Providers:
        """The account's providers (never their keys)."""
        docs = await self.db.providers.find({"account": account}).sort("provider", 1).to_list(None)
        return Providers(providers=[provider_view(d) for d in docs])

    async def create_region(self, body: CreateRegion, account: str) -> RegionView:
        """A physical (R-REG-1) or GCP (R-REG-2) region."""
        if body.provider == ProviderKind.gcp:
            return await self.cloud.create_region(account, body.name, body.storage_class)
        return await self.create_physical_region(
            account, body.name, body.storage_mode, body.allow_public_jobs
        )

    async def create_physical_region(
        self, account: str, name: str, storage_mode: str, allow_public_jobs: bool
    ) -> RegionView:
        if await self.records.provider(account, "physical") is None:
            raise Refused(
                "conflict",
                "enable the physical provider first (gpufleet provider enable physical)",
            )
        if not REGION_NAME_RE.fullmatch(name):
            raise invalid(
                "name",
                "R-REG-1",
                f"{name!r} is not a DNS host name",
                "lowercase letters, digits and '-', 1-63 characters",
            )
        if storage_mode not in {"local", "central"}:
            raise invalid("storage_mode", "R-REG-1", "unknown storage mode", "local | central")
        doc = {
            "_id": f"{account}/{name}",
            "owner": account,
            "name": name,
            "provider": "physical",
            "storage_mode": storage_mode,
            "allow_public_jobs": allow_public_jobs,
            "created_at_ms": now_ms(self.records.clock()),
        }
        return await self.records.insert_region(doc)

    async def list_regions(self, body: ListRegions, account: str) -> Regions:
        """The account's regions."""
        docs = await self.db.regions.find({"owner": account}).sort("name", 1).to_list(None)
        return Regions(regions=[region_view(d) for d in docs])
