"""The Google Cloud half: provider keys, regions with quotas, bursting, the lifecycle bridge.

- Enabling `gcp` (R-PROV-2) validates the service-account key, stores it Fernet-encrypted,
  creates (idempotently) the Logging sink, its Pub/Sub topic and the provisioner's
  subscription, and starts the bridge (Pub/Sub -> NATS).
- A GCP region (R-REG-2) is one of the supported cloud regions; creating it reads its
  quotas, computes runnable jobs per GPU type (R-REG-3) and records its storage node.
- Bursting (R-SCHED-3): the scheduler's PendingDemandChanged lists waiting workers no node
  can take; `scaling.plan_scale_up` decides which instances to create, `plan_scale_down`
  which idle ones to delete. Each decision is made again on every tick, from stored state.
- Instance lifecycle reaches gpufleet only through the audit log (sink -> Pub/Sub -> bridge
  -> NATS -> `on_cloud_event`): the provisioner never assumes an instance exists because it
  asked for one.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from datetime import datetime
from typing import Any

from gpufleet_bus.publish import Publisher
from gpufleet_contracts.jobs import Demand, PendingDemandChanged
from gpufleet_contracts.nodes import CloudInstanceEvent, NodeState
from gpufleet_contracts.providers import PaymentMode, ProviderKind
from gpufleet_store import Transaction, now_ms

from .bridge import LifecycleBridge
from .gcp import GcpEndpoints, GcpError, GcpProject
from .keys import KeyError_, SecretBox, parse_key
from .lifecycle import RANK, transition
from .quota import Quota, gcp_data, runnable_by_type
from .scaling import LIVE, Instance, Region, ScalePolicy, plan_scale_down, plan_scale_up
from .service import Doc, Provisioner, Refused, invalid, node_id_for, region_view

log = logging.getLogger("gpufleet.provisioner.cloud")

STORAGE_CLASSES = {"standard": 1000, "large": 4000}  # storage node class -> size GB


class CloudManager:
    def __init__(
        self,
        prov: Provisioner,
        broker: Publisher,
        endpoints: GcpEndpoints | None = None,
    ) -> None:
        self.prov = prov
        self.db = prov.db
        self.broker = broker
        self.endpoints = endpoints or GcpEndpoints.from_env()
        self.box = SecretBox(prov.settings.secret_key)
        self.default_policy = prov.settings.policy()
        self.projects: dict[str, GcpProject] = {}  # account -> client
        self.bridges: dict[str, LifecycleBridge] = {}
        self.lock = asyncio.Lock()
        self.retry_after: dict[tuple[str, str], int] = {}  # (account, region) -> ms

    # --- provider ---------------------------------------------------------------------------

    async def enable_gcp(self, account: str, payment_mode: str, key_json: str | None) -> Doc:
        mode = self.prov._payment_mode(payment_mode)
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
        if await self.prov.provider(account, "gcp") is not None:
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
        view = await self.prov._enable(account, ProviderKind.gcp, mode, extra)
        self.projects[account] = project
        self._start_bridge(account, project)
        return view

    async def set_policy(self, account: str, values: dict[str, Any]) -> Doc:
        doc = await self.prov.provider(account, "gcp")
        if doc is None:
            raise Refused("not_found", "the gcp provider is not enabled")
        merged = {**(doc.get("policy") or {}), **{k: v for k, v in values.items() if v is not None}}
        try:
            policy = ScalePolicy.from_doc(merged, self.default_policy)
        except TypeError as exc:
            raise invalid("policy", "R-SCHED-3", str(exc)) from None
        await self.db.providers.update_one({"_id": doc["_id"]}, {"$set": {"policy": merged}})
        return dict(policy.__dict__)

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

    def stop(self) -> None:
        for bridge in self.bridges.values():
            bridge.stop()
        self.bridges.clear()

    # --- regions (R-REG-2/3) ------------------------------------------------------------------

    async def _gcp(self, account: str) -> tuple[Doc, GcpProject]:
        doc = await self.prov.provider(account, "gcp")
        if doc is None:
            raise Refused(
                "conflict", "enable the gcp provider first (gpufleet provider enable gcp)"
            )
        return doc, self.project(account, doc)

    async def region_quotas(self, account: str, name: str) -> Doc:
        self._supported(name)
        _, project = await self._gcp(account)
        quotas = await self._quotas(project, name)
        return {
            "region": name,
            "quotas": {m: {"limit": q.limit, "usage": q.usage} for m, q in quotas.items()},
            "runnable_jobs": runnable_by_type(quotas),
        }

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

    async def create_region(self, account: str, name: str, storage_class: str = "standard") -> Doc:
        self._supported(name)
        if storage_class not in STORAGE_CLASSES:
            raise invalid(
                "storage_class", "R-REG-2", "unknown storage class", " | ".join(STORAGE_CLASSES)
            )
        _, project = await self._gcp(account)
        quotas = await self._quotas(project, name)
        now = now_ms(self.prov.clock())
        doc = {
            "_id": f"{account}/{name}",
            "owner": account,
            "name": name,
            "provider": "gcp",
            "storage_mode": "central",
            "allow_public_jobs": False,
            "zones": gcp_data().regions[name],
            "quotas": {m: {"limit": q.limit, "usage": q.usage} for m, q in quotas.items()},
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
        return await self.prov.insert_region(doc, [storage])

    # --- bursting (R-SCHED-3) ---------------------------------------------------------------

    async def on_pending_demand(self, evt: PendingDemandChanged) -> None:
        await self.db.demand.replace_one(
            {"_id": "pending"},
            {
                "_id": "pending",
                "demands": [d.model_dump(mode="json") for d in evt.demands],
                "at_ms": now_ms(evt.at),
            },
            upsert=True,
        )
        await self.burst_pass()

    async def _instances(self) -> list[tuple[Doc, Instance]]:
        docs = await self.db.nodes.find({"provider": "gcp", "kind": "compute"}).to_list(None)
        out = []
        for d in docs:
            c = d.get("cloud") or {}
            if c.get("state") == "deleted":
                continue
            out.append(
                (
                    d,
                    Instance(
                        name=d["minion_id"],
                        owner=d["owner"],
                        region=d["region"],
                        gpu_type=c.get("gpu_type", ""),
                        gpu_count=int(c.get("gpu_count", 1)),
                        state=c.get("state", "requested"),
                        created_ms=int(c.get("created_ms", 0)),
                        busy=bool(d.get("busy")) and d["state"] == NodeState.active.value,
                        idle_since_ms=d.get("idle_since_ms")
                        if d["state"] == NodeState.active.value
                        else None,
                        demand=c.get("demand"),
                        registered=d.get("registered_at_ms") is not None,
                    ),
                )
            )
        return out

    async def _policy(self, account: str) -> ScalePolicy:
        doc = await self.prov.provider(account, "gcp")
        return ScalePolicy.from_doc((doc or {}).get("policy"), self.default_policy)

    async def burst_pass(self) -> None:
        async with self.lock:
            now = now_ms(self.prov.clock())
            instances = await self._instances()
            await self._scale_down(instances, now)
            await self._scale_up([i for _, i in instances], now)

    async def _scale_down(self, instances: list[tuple[Doc, Instance]], now: int) -> None:
        by_owner: dict[str, list[Instance]] = {}
        docs = {i.name: d for d, i in instances}
        for _, i in instances:
            by_owner.setdefault(i.owner, []).append(i)
        for owner, items in by_owner.items():
            policy = await self._policy(owner)
            for down in plan_scale_down(items, policy, now):
                await self._delete(docs[down.name], down.reason)

    async def _delete(self, node: Doc, reason: str) -> None:
        c = node.get("cloud") or {}
        if c.get("delete_requested"):
            return
        log.info("deleting instance %s: %s", node["minion_id"], reason)

        async def body(tx: Transaction) -> None:
            await self.db.nodes.update_one(
                {"_id": node["_id"]},
                {"$set": {"cloud.delete_requested": True, "cloud.delete_reason": reason}},
                session=tx.session,
            )
            if node["state"] == NodeState.active.value:
                # No new work while it goes; the audit log then says when it is gone.
                await self.prov._set_state(
                    tx, node, NodeState.maintenance, f"ephemeral node deleted: {reason}"
                )

        await self.prov.store.transaction(body)
        doc = await self.prov.provider(node["owner"], "gcp")
        if doc is None:
            return
        project = self.project(node["owner"], doc)
        try:
            existed = await asyncio.to_thread(
                project.delete_instance, c.get("zone", ""), node["minion_id"]
            )
        except GcpError as exc:
            log.warning("delete of %s failed, retried next tick: %s", node["minion_id"], exc)
            await self.db.nodes.update_one(
                {"_id": node["_id"]}, {"$set": {"cloud.delete_requested": False}}
            )
            return
        if not existed:  # never created (insert refused or failed): nothing will be logged
            await self._finish(node, "instance does not exist")

    async def _finish(self, node: Doc, reason: str) -> None:
        async def body(tx: Transaction) -> None:
            await self.db.nodes.update_one(
                {"_id": node["_id"]}, {"$set": {"cloud.state": "deleted"}}, session=tx.session
            )
            fresh = await self.db.nodes.find_one({"_id": node["_id"]}, session=tx.session)
            if fresh and fresh["state"] != NodeState.removed.value:
                await self.prov._set_state(tx, fresh, NodeState.removed, reason)

        await self.prov.store.transaction(body)

    async def _scale_up(self, instances: list[Instance], now: int) -> None:
        pending = await self.db.demand.find_one({"_id": "pending"})
        demands = [Demand.model_validate(d) for d in (pending or {}).get("demands", [])]
        covered = {i.demand for i in instances if i.state in LIVE}
        offered = gcp_data().gpu_types
        wanted = [
            d
            for d in demands
            if d.burst_allowed
            and f"{d.job_id}/{d.worker}" not in covered
            and any(t in offered for t in d.gpu_types)  # else no quota read is worth it
        ]
        if not wanted:
            return
        for owner in sorted({d.owner for d in wanted}):
            provider = await self.prov.provider(owner, "gcp")
            if provider is None:
                continue
            project = self.project(owner, provider)
            regions: list[Region] = []
            async for r in self.db.regions.find({"owner": owner, "provider": "gcp"}):
                if self.retry_after.get((owner, r["name"]), 0) > now:
                    continue
                try:
                    quotas = await asyncio.to_thread(project.region_quotas, r["name"])
                except GcpError as exc:
                    log.warning("quotas of %s unreadable: %s", r["name"], exc)
                    continue
                await self.db.regions.update_one(
                    {"_id": r["_id"]},
                    {
                        "$set": {
                            "quotas": {
                                m: {"limit": q.limit, "usage": q.usage} for m, q in quotas.items()
                            },
                            "runnable_jobs": runnable_by_type(quotas),
                        }
                    },
                )
                regions.append(Region(owner, r["name"], r.get("zones") or [], quotas))
            policy = await self._policy(owner)
            mine = [d for d in wanted if d.owner == owner]
            for up in plan_scale_up(mine, instances, regions, policy, now):
                await self._create(
                    project, up.owner, up.region, up.zone, up.gpu_type, up.gpu_count, up.demand, now
                )

    async def _create(
        self,
        project: GcpProject,
        owner: str,
        region: str,
        zone: str,
        gpu_type: str,
        gpus: int,
        demand: str,
        now: int,
    ) -> None:
        name = f"gf-{uuid.uuid4().hex[:12]}"
        doc = {
            "_id": node_id_for(name),
            "minion_id": name,
            "name": name,
            "region": region,
            "owner": owner,
            "kind": "compute",
            "provider": "gcp",
            "state": NodeState.provisioning.value,
            "gpus": [],
            "simulated": self.endpoints.emulated,
            "ephemeral": True,
            "cloud": {
                "project_id": project.project,
                "zone": zone,
                "gpu_type": gpu_type,
                "gpu_count": gpus,
                "state": "requested",
                "rank": 0,
                "applied": [],
                "demand": demand,
                "created_ms": now,
                "history": [],
            },
            "history": [
                {"state": "provisioning", "at_ms": now, "reason": f"burst for worker {demand}"}
            ],
        }
        await self.db.nodes.insert_one(doc)
        gpu = gcp_data().gpu_types[gpu_type]
        metadata = {"gpufleet-minion-id": name, "gpufleet-region": region}
        if self.prov.identity is not None and self.prov.identity.issuer is not None:
            # The instance's agent enrols with this one-time token (R-NODE-2): read from
            # the metadata server by the instance alone, spent at its first start.
            issued = await self.prov.identity.issue_join_token(owner, name, region, 3600)
            metadata["gpufleet-join-token"] = str(issued["token"])
        else:
            log.warning("no signing keys (GPUFLEET_AUTH_DIR): %s cannot enrol", name)
        body = project.instance_body(
            zone,
            name,
            gpu,
            gpus,
            labels={"gpufleet-account": owner, "gpufleet-managed": "true"},
            metadata=metadata,
        )
        log.info("bursting: creating %s (%d x %s) in %s for %s", name, gpus, gpu_type, zone, demand)
        try:
            op = await asyncio.to_thread(project.insert_instance, zone, body)
        except GcpError as exc:
            log.warning("insert of %s refused (%s): %s", name, exc.code, exc.message)
            retry_ms = int(self.prov.settings.burst_retry_s * 1000)
            self.retry_after[(owner, region)] = now + retry_ms
            await self.db.nodes.update_one(
                {"_id": doc["_id"]},
                {
                    "$set": {
                        "cloud.state": "failed",
                        "cloud.error": f"{exc.code}: {exc.message}",
                        "state": NodeState.removed.value,
                    },
                    "$push": {
                        "history": {
                            "state": "removed",
                            "at_ms": now,
                            "reason": f"insert refused: {exc.message}",
                        }
                    },
                },
            )
            await self.db.nodes.update_one(
                {"_id": doc["_id"]}, {"$set": {"cloud.state": "deleted"}}
            )
            return
        await self.db.nodes.update_one({"_id": doc["_id"]}, {"$set": {"cloud.operation": op}})

    # --- lifecycle events (from the bridge) ---------------------------------------------

    async def on_cloud_event(self, evt: CloudInstanceEvent, msg_id: str | None) -> None:
        node = await self.db.nodes.find_one({"minion_id": evt.instance, "provider": "gcp"})
        if node is None:
            log.info("audit log: instance %s is not gpufleet's; ignored", evt.instance)
            return
        c = node.get("cloud") or {}
        record: Doc = {
            "action": evt.action,
            "phase": evt.phase,
            "at": evt.timestamp.isoformat(),
            "pubsub_message_id": evt.pubsub_message_id,
            "nats_msg_id": msg_id,
            "insert_id": evt.log_insert_id,
        }
        t = transition(evt, int(c.get("rank", 0)), set(c.get("applied") or []), node["state"])
        record["applied"] = t.apply

        async def body(tx: Transaction) -> None:
            update: Doc = {"$push": {"cloud.history": record}}
            if t.apply:
                sets: Doc = {"cloud.rank": RANK[(evt.action, evt.phase)]}
                if t.cloud_state and not (
                    t.cloud_state in {"provisioning", "running"}
                    and c.get("state") in {"failed", "deleted"}
                ):
                    sets["cloud.state"] = t.cloud_state
                if evt.instance_id:
                    sets["cloud.instance_id"] = evt.instance_id
                if evt.error:
                    sets["cloud.error"] = evt.error
                update["$set"] = sets
                update["$addToSet"] = {"cloud.applied": f"{evt.action}:{evt.phase}"}
            await self.db.nodes.update_one({"_id": node["_id"]}, update, session=tx.session)
            if t.apply and t.node_state and node["state"] != t.node_state:
                if node["state"] == NodeState.provisioning.value and t.node_state == "lost":
                    return  # never registered: nothing ran there
                await self.prov._set_state(
                    tx,
                    node,
                    NodeState(t.node_state),
                    t.reason or evt.action,
                    extra={"lost_for_good": True} if t.node_state == "lost" else None,
                )

        await self.prov.store.transaction(body)
        log.info(
            "instance %s: %s/%s %s",
            evt.instance,
            evt.action,
            evt.phase,
            "applied" if t.apply else "duplicate or stale: recorded only",
        )
        if t.apply and t.cloud_state in {"preempted", "terminated", "failed"}:
            await self.burst_pass()  # delete it now, and burst again for its workers


def _at(ms: int) -> datetime:
    from gpufleet_store import from_ms

    at = from_ms(ms)
    assert at is not None
    return at


__all__ = ["CloudManager", "PaymentMode", "region_view"]
