"""The Google Cloud accounts: provider keys, projects, regions with quotas, the bridges.

- Enabling `gcp` (R-PROV-2) validates the service-account key, stores it Fernet-encrypted,
  creates (idempotently) the Logging sink, its Pub/Sub topic and the provisioner's
  subscription, and starts the bridge (Pub/Sub -> NATS, `bridge.py`).
- A GCP region (R-REG-2) is one of the supported cloud regions; creating it reads its
  quotas, computes runnable jobs per GPU type (R-REG-3) and records its storage node.
- The burst policy (R-SCHED-3) is stored on the account's gcp provider; bursting itself,
  and what the audit log says of instances, is `burst.py`.
"""

from __future__ import annotations

import asyncio
import logging

from gpufleet_bus.publish import Publisher
from gpufleet_contracts.errors import NotFound, Refused
from gpufleet_contracts.nodes import NodeState
from gpufleet_contracts.providers import (
    BurstPolicy,
    ProviderKind,
    ProviderView,
    RegionQuotas,
    RegionView,
    SetBurstPolicy,
    ShowRegionQuotas,
)
from gpufleet_store import Doc, now_ms

from .bridge import LifecycleBridge
from .gcp import GcpError, GcpProject
from .keys import KeyError_, SecretBox, parse_key
from .quota import Quota, gcp_data, runnable_by_type
from .records import Records, invalid, node_id_for, payment_mode
from .scaling import ScalePolicy

log = logging.getLogger("gpufleet.provisioner.cloud")

STORAGE_CLASSES = {"standard": 1000, "large": 4000}  # storage node class -> size GB


def quota_doc(quotas: dict[str, Quota]) -> Doc:
    return {m: {"limit": q.limit, "usage": q.usage} for m, q in quotas.items()}


class CloudAccounts:
    def __init__(self, records: Records, broker: Publisher) -> None:
        self.records = records
        self.db = records.db
        self.broker = broker
        self.endpoints = records.settings.gcp_endpoints()
        self.box = SecretBox(records.settings.secret_key)
        self.default_policy = records.settings.policy()
        self.projects: dict[str, GcpProject] = {}  # account -> client
        self.bridges: dict[str, LifecycleBridge] = {}

    # --- provider ---------------------------------------------------------------------------

    async def enable_gcp(self, account: str, mode_name: str, key_json: str | None) -> ProviderView:
        mode = payment_mode(mode_name)
        if not key_json:
            raise invalid("key", "R-PROV-2", "a service-account JSON key is required")
        try:
            key = parse_key(key_json)
        except KeyError_ as exc:
            fields = [
                {"field": f"key.{f}", "rule": "R-PROV-2", "message": m} for f, m in exc.problems
            ]
            raise Refused("invalid", "the service-account key is not valid", fields) from None
        if not self.box.configured:
            raise Refused(
                "unavailable",
                "the provisioner has no GPUFLEET_SECRET_KEY to encrypt the key with; "
                "an operator must configure one",
            )
        if await self.records.provider(account, "gcp") is not None:
            raise Refused("conflict", "the gcp provider is already enabled for this account")
        project = GcpProject(key, self.endpoints)
        try:
            lifecycle = await asyncio.to_thread(project.ensure_lifecycle)
        except GcpError as exc:
            raise Refused(
                "unavailable", f"Google Cloud refused the set-up: {exc.message}"
            ) from None
        extra = {
            "gcp_project_id": key.project_id,
            "client_email": key.client_email,
            "key_encrypted": self.box.seal(key),
            "lifecycle": lifecycle,
        }
        view = await self.records.enable(account, ProviderKind.gcp, mode, extra)
        self.projects[account] = project
        self._start_bridge(account, project)
        return view

    async def set_burst_policy(self, body: SetBurstPolicy, account: str) -> BurstPolicy:
        """Burst policy of the account (R-SCHED-3)."""
        doc = await self.records.provider(account, "gcp")
        if doc is None:
            raise NotFound("the gcp provider is not enabled")
        given = body.model_dump(include=set(SetBurstPolicy.model_fields), exclude_none=True)
        merged = {**(doc.get("policy") or {}), **given}
        policy = ScalePolicy.from_doc(merged, self.default_policy)
        await self.db.providers.update_one({"_id": doc["_id"]}, {"$set": {"policy": merged}})
        return BurstPolicy(**policy.__dict__)

    async def policy(self, account: str) -> ScalePolicy:
        doc = await self.records.provider(account, "gcp")
        return ScalePolicy.from_doc((doc or {}).get("policy"), self.default_policy)

    def project(self, account: str, provider_doc: Doc) -> GcpProject:
        if account not in self.projects:
            key = self.box.open(provider_doc["key_encrypted"])
            self.projects[account] = GcpProject(key, self.endpoints)
        return self.projects[account]

    def _start_bridge(self, account: str, project: GcpProject) -> None:
        if account in self.bridges:
            return
        bridge = LifecycleBridge(project, self.broker, asyncio.get_running_loop())
        bridge.start()
        self.bridges[account] = bridge

    async def start(self) -> None:
        """At start-up: for every account with gcp enabled, make sure its sink, topic and
        subscription still exist (idempotent; someone may have deleted one), then bridge."""
        async for doc in self.db.providers.find({"provider": "gcp"}):
            try:
                project = self.project(doc["account"], doc)
                await asyncio.to_thread(project.ensure_lifecycle)
                self._start_bridge(doc["account"], project)
            except Exception as exc:
                log.error("no lifecycle bridge for account %s: %s", doc["account"], exc)

    async def stop(self) -> None:
        for bridge in self.bridges.values():
            bridge.stop()
        self.bridges.clear()

    # --- regions (R-REG-2/3) ------------------------------------------------------------------

    async def _gcp(self, account: str) -> tuple[Doc, GcpProject]:
        doc = await self.records.provider(account, "gcp")
        if doc is None:
            raise Refused(
                "conflict", "enable the gcp provider first (gpufleet provider enable gcp)"
            )
        return doc, self.project(account, doc)

    async def region_quotas(self, body: ShowRegionQuotas, account: str) -> RegionQuotas:
        """A GCP region's quotas and runnable jobs."""
        self._supported(body.name)
        _, project = await self._gcp(account)
        quotas = await self._quotas(project, body.name)
        return RegionQuotas.model_validate(
            {
                "region": body.name,
                "quotas": quota_doc(quotas),
                "runnable_jobs": runnable_by_type(quotas),
            }
        )

    def _supported(self, name: str) -> None:
        if name not in gcp_data().regions:
            raise invalid(
                "name",
                "R-REG-2",
                f"{name!r} is not a supported GCP region",
                ", ".join(gcp_data().regions),
            )

    async def _quotas(self, project: GcpProject, region: str) -> dict[str, Quota]:
        try:
            return await asyncio.to_thread(project.region_quotas, region)
        except GcpError as exc:
            raise Refused(
                "unavailable",
                f"could not read the quotas of {region}: {exc.message} (does the service "
                "account have Compute Admin?)",
            ) from None

    async def create_region(
        self, account: str, name: str, storage_class: str = "standard"
    ) -> RegionView:
        self._supported(name)
        if storage_class not in STORAGE_CLASSES:
            raise invalid(
                "storage_class", "R-REG-2", "unknown storage class", " | ".join(STORAGE_CLASSES)
            )
        _, project = await self._gcp(account)
        quotas = await self._quotas(project, name)
        now = now_ms(self.records.clock())
        doc = {
            "_id": f"{account}/{name}",
            "owner": account,
            "name": name,
            "provider": "gcp",
            "storage_mode": "central",
            "allow_public_jobs": False,
            "zones": gcp_data().regions[name],
            "quotas": quota_doc(quotas),
            "runnable_jobs": runnable_by_type(quotas),
            "storage_class": storage_class,
            "storage_size_gb": STORAGE_CLASSES[storage_class],
            "created_at_ms": now,
        }
        storage_minion = f"gcp-{account}-{name}-storage"[:64]
        storage = {
            "_id": node_id_for(storage_minion),
            "minion_id": storage_minion,
            "name": f"{name}-storage",
            "region": name,
            "owner": account,
            "kind": "storage",
            "provider": "gcp",
            # Managed by gpufleet (R-NODE-3: GCP regions always have one); active at once.
            "state": NodeState.active.value,
            "storage_class": storage_class,
            "storage_size_gb": STORAGE_CLASSES[storage_class],
            "gpus": [],
            "simulated": self.endpoints.emulated,
            "history": [{"state": "active", "at_ms": now, "reason": "auto-provisioned"}],
        }
        return await self.records.insert_region(doc, [storage])
