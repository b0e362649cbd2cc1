"""Bursting (R-SCHED-3) and the instances' lifecycle, as the audit log tells it.

- The scheduler's PendingDemandChanged lists waiting workers no node can take;
  `scaling.plan_scale_up` decides which instances to create, `plan_scale_down` which idle
  ones to delete. Each decision is made again on every tick, from stored state.
- Instance lifecycle reaches gpufleet only through the audit log (sink -> Pub/Sub -> bridge
  -> NATS -> `on_cloud_event`): the provisioner never assumes an instance exists because it
  asked for one.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

from gpufleet_bus import Delivery
from gpufleet_contracts.jobs import Demand, PendingDemandChanged
from gpufleet_contracts.nodes import CloudInstanceEvent, NodeState
from gpufleet_store import Doc, Transaction, now_ms

from .cloud import CloudAccounts, quota_doc
from .gcp import GcpError, GcpProject
from .identity import Identity
from .lifecycle import RANK, transition
from .quota import gcp_data, runnable_by_type
from .records import Records, node_id_for
from .scaling import LIVE, Instance, Region, plan_scale_down, plan_scale_up

log = logging.getLogger("gpufleet.provisioner.cloud")


class Bursting:
    def __init__(self, records: Records, cloud: CloudAccounts, identity: Identity | None) -> None:
        self.records = records
        self.db = records.db
        self.cloud = cloud
        self.identity = identity
        self.lock = asyncio.Lock()
        self.retry_after: dict[tuple[str, str], int] = {}  # (account, region) -> ms
        self._enabled = False  # some account has gcp enabled (it stays so once it has)

    async def on_pending_demand(self, evt: PendingDemandChanged) -> None:
        """The scheduler's waiting workers no node can take: kept, then a pass at once."""
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

    async def enabled(self) -> bool:
        """Whether any account has a cloud provider (gcp) to burst to: without one there is
        nothing to scale up or down, and a pass is skipped (it read every gcp node, the
        stored demand, and each owner's provider for nothing: issue 15)."""
        if not self._enabled:
            self._enabled = await self.db.providers.find_one({"provider": "gcp"}) is not None
        return self._enabled

    async def burst_pass(self) -> None:
        if not await self.enabled():
            return
        async with self.lock:
            now = now_ms(self.records.clock())
            instances = await self._instances()
            await self._scale_down(instances, now)
            await self._scale_up([i for _, i in instances], now)

    async def _scale_down(self, instances: list[tuple[Doc, Instance]], now: int) -> None:
        by_owner: dict[str, list[Instance]] = {}
        docs = {i.name: d for d, i in instances}
        for _, i in instances:
            by_owner.setdefault(i.owner, []).append(i)
        for owner, items in by_owner.items():
            policy = await self.cloud.policy(owner)
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
                await self.records.set_state(
                    tx, node, NodeState.maintenance, f"ephemeral node deleted: {reason}"
                )

        await self.records.transaction(body)
        doc = await self.records.provider(node["owner"], "gcp")
        if doc is None:
            return
        project = self.cloud.project(node["owner"], doc)
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
                await self.records.set_state(tx, fresh, NodeState.removed, reason)

        await self.records.transaction(body)

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
            provider = await self.records.provider(owner, "gcp")
            if provider is None:
                continue
            project = self.cloud.project(owner, provider)
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
                            "quotas": quota_doc(quotas),
                            "runnable_jobs": runnable_by_type(quotas),
                        }
                    },
                )
                regions.append(Region(owner, r["name"], r.get("zones") or [], quotas))
            policy = await self.cloud.policy(owner)
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
            "simulated": self.cloud.endpoints.emulated,
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
        if self.identity is not None and self.identity.issuer is not None:
            # The instance's agent enrols with this one-time token (R-NODE-2): read from
            # the metadata server by the instance alone, spent at its first start.
            issued = await self.identity.join_token(owner, name, region, 3600)
            metadata["gpufleet-join-token"] = issued.token
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
            retry_ms = int(self.records.settings.burst_retry_s * 1000)
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

    async def on_cloud_event(self, evt: CloudInstanceEvent, delivery: Delivery) -> None:
        """An instance's lifecycle, from the audit log through the bridge (R-NODE-5)."""
        msg_id = delivery.id
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
                await self.records.set_state(
                    tx,
                    node,
                    NodeState(t.node_state),
                    t.reason or evt.action,
                    extra={"lost_for_good": True} if t.node_state == "lost" else None,
                )

        await self.records.transaction(body)
        log.info(
            "instance %s: %s/%s %s",
            evt.instance,
            evt.action,
            evt.phase,
            "applied" if t.apply else "duplicate or stale: recorded only",
        )
        if t.apply and t.cloud_state in {"preempted", "terminated", "failed"}:
            await self.burst_pass()  # delete it now, and burst again for its workers
