"""Rollouts and what devices report (R-DEV-3): the service side of rollout.py. A rollout, its
devices' states and the commands to the devices change together in one transaction (the
commands through the outbox), driven by the account's requests, the devices' reports and a
periodic round for timeouts. Touches the database and the outbox."""

from __future__ import annotations

import logging
import uuid
from datetime import datetime

from gpufleet_bus import emit
from gpufleet_contracts import subjects
from gpufleet_contracts.clock import Clock
from gpufleet_contracts.devices import (
    ApplyDeviceConfig,
    DeployConfig,
    DeployState,
    DeviceConfigSpec,
    DeviceState,
    DeviceStatusReported,
    RolloutList,
    RolloutPhase,
    RolloutView,
)
from gpufleet_contracts.errors import NotFound, Refused
from gpufleet_store import Doc, Store, Transaction, now_ms
from pymongo import ASCENDING, DESCENDING, IndexModel

from . import rollout
from .rollout import Deploy, Effect, Revert, Rollout
from .views import rollout_doc, rollout_of, rollout_view

log = logging.getLogger("gpufleet.device_fleet.deployments")
STATUS_TOKEN = 5  # gpufleet.v1.evt.device.status.<minion_id>
LIVE = {"$ne": DeviceState.removed.value}
OPEN = [RolloutPhase.canary.value, RolloutPhase.batches.value]

INDEXES = {
    "rollouts": [
        IndexModel([("owner", ASCENDING), ("created_at_ms", DESCENDING)]),
        IndexModel([("phase", ASCENDING)]),
        # none on `device_ids`: nx-27017 matches nothing in an indexed array (docs/nx-27017-gaps.md)
    ],
}


class Deployments:
    def __init__(self, store: Store, clock: Clock) -> None:
        self.store = store
        self.db = store.db
        self.clock = clock

    # --- an account's requests --------------------------------------------------------

    async def deploy(self, body: DeployConfig, account: str) -> RolloutView:
        """A rollout of one configuration to the devices named, or to every device that uses
        `config` ("deploy latest")."""
        now = self.clock()
        rollout_id = uuid.uuid4().hex[:16]

        async def tx_body(tx: Transaction) -> Doc:
            devices = await self._targets(tx, body, account)
            region, config = devices[0]["region"], devices[0]["config"]
            cfg = await self.db.device_configs.find_one(
                {"owner": account, "region": region, "name": config}, session=tx.session
            )
            if cfg is None:
                raise NotFound(f"device configuration {config!r} not found in region {region!r}")
            busy = await self.db.rollouts.find_one(
                {
                    "owner": account,
                    "phase": {"$in": OPEN},
                    "device_ids": {"$in": [d["_id"] for d in devices]},
                },
                session=tx.session,
            )
            if busy is not None:
                raise Refused(
                    "conflict",
                    f"rollout {busy['_id']} is still under way on some of these devices: "
                    "wait for it or cancel it (gpufleet device rollout cancel)",
                )
            policy = body.policy.model_copy(
                update={"canary": min(body.policy.canary, len(devices))}
            )
            ids = [d["_id"] for d in devices]
            r, effects = rollout.begin(rollout_id, ids, policy, now)
            doc: Doc = {
                "_id": rollout_id,
                "owner": account,
                "region": region,
                "config": config,
                "spec": cfg["spec"],
                "device_ids": ids,
                "created_at_ms": now_ms(now),
                **rollout_doc(r),
            }
            await self.db.rollouts.insert_one(doc, session=tx.session)
            for d in devices:
                await self._mark(tx, d["_id"], rollout_id, DeployState.waiting, None)
            await self._apply(tx, doc, r, effects, now)
            return doc

        doc = await self.store.transaction(tx_body)
        return await self._view(doc)

    async def _targets(self, tx: Transaction, body: DeployConfig, account: str) -> list[Doc]:
        s = tx.session
        if body.config is not None:
            if body.devices:
                raise Refused.of_field(
                    "invalid",
                    "name devices or a configuration, not both",
                    field="devices",
                    rule="R-DEV-3",
                    says="devices and config together",
                )
            query: Doc = {"owner": account, "config": body.config, "state": LIVE}
            if body.region is not None:
                query["region"] = body.region
            devices = await self.db.devices.find(query, session=s).sort("name", 1).to_list(None)
            if not devices:
                raise NotFound(f"no device uses configuration {body.config!r}")
            if len({d["region"] for d in devices}) > 1:
                raise Refused.of_field(
                    "invalid",
                    f"configuration {body.config!r} is used in several regions: name one",
                    field="region",
                    rule="R-DEV-2",
                    says="ambiguous configuration name",
                )
            return list(devices)
        if not body.devices:
            raise Refused.of_field(
                "invalid",
                "name the devices or a configuration",
                field="devices",
                rule="R-DEV-3",
                says="nothing to deploy to",
            )
        devices = []
        for ref in dict.fromkeys(body.devices):
            d = await self.db.devices.find_one(
                {
                    "owner": account,
                    "state": LIVE,
                    "$or": [{"name": ref}, {"minion_id": ref}, {"_id": ref}],
                },
                session=s,
            )
            if d is None:
                raise NotFound(f"device {ref!r} not found")
            if d.get("config") is None:
                raise Refused.of_field(
                    "invalid",
                    f"device {d['name']!r} has no configuration set (gpufleet device set-config)",
                    field="devices",
                    rule="R-DEV-3",
                    says="no configuration set",
                )
            devices.append(d)
        if len({(d["region"], d["config"]) for d in devices}) > 1:
            raise Refused.of_field(
                "invalid",
                "a rollout deploys one configuration: these devices use several",
                field="devices",
                rule="R-DEV-3",
                says="devices with different configurations",
            )
        return devices

    async def show(self, account: str, rollout_id: str) -> RolloutView:
        doc = await self.db.rollouts.find_one({"_id": rollout_id, "owner": account})
        if doc is None:
            raise NotFound(f"rollout {rollout_id!r} not found")
        return await self._view(doc)

    async def recent(self, account: str, limit: int) -> RolloutList:
        docs = (
            await self.db.rollouts.find({"owner": account})
            .sort("created_at_ms", -1)
            .limit(limit)
            .to_list(None)
        )
        return RolloutList(rollouts=[await self._view(d) for d in docs])

    async def cancel(self, account: str, rollout_id: str) -> RolloutView:
        now = self.clock()

        async def tx_body(tx: Transaction) -> Doc:
            doc = await self.db.rollouts.find_one(
                {"_id": rollout_id, "owner": account}, session=tx.session
            )
            if doc is None:
                raise NotFound(f"rollout {rollout_id!r} not found")
            r, effects = rollout.cancel(rollout_of(doc), now, "cancelled by its owner")
            return await self._apply(tx, doc, r, effects, now)

        return await self._view(await self.store.transaction(tx_body))

    async def cancel_all(self, tx: Transaction, account: str, now: datetime, reason: str) -> int:
        """Every open rollout of `account` cancelled in `tx` (its account was removed): how
        many. A removed device is told nothing (`_apply`)."""
        docs = await self.db.rollouts.find(
            {"owner": account, "phase": {"$in": OPEN}}, session=tx.session
        ).to_list(None)
        for doc in docs:
            r, effects = rollout.cancel(rollout_of(doc), now, reason)
            await self._apply(tx, doc, r, effects, now)
        return len(docs)

    # --- a device's reports and the clock ---------------------------------------------

    async def reported(self, body: DeviceStatusReported, subject: str, at: datetime | None) -> None:
        """A device's report, taken only on its own subject (the server lets a device's
        credential publish nothing else): its state, inference status and the rollout."""
        sender = subjects.token_at(subject, STATUS_TOKEN)
        if sender != body.minion_id:
            log.warning(
                "a status naming %s arrived on the subject of %s: ignored", body.minion_id, sender
            )
            return
        now = at or self.clock()

        async def tx_body(tx: Transaction) -> None:
            s = tx.session
            device = await self.db.devices.find_one({"minion_key": body.minion_id}, session=s)
            if device is None:
                log.info("a status from %s, which is no device: ignored", body.minion_id)
                return
            update: Doc = {"last_seen_ms": now_ms(now)}
            if device["state"] == DeviceState.provisioning.value:
                update["state"] = DeviceState.active.value  # R-DEV-1: active after provisioning
            if body.inference is not None:
                update["inference"] = body.inference.value
            ours = body.deployment_id is not None and body.deployment_id == device.get(
                "deployment_id"
            )
            if ours and _moves(device.get("deploy_state"), body.state):
                update["deploy_state"] = body.state.value
                update["deploy_reason"] = body.reason if body.state == DeployState.failed else None
                if body.state == DeployState.running:
                    update["deployed_at_ms"] = now_ms(now)
                    update["last_good"] = device.get("pending")
            await self.db.devices.update_one({"_id": device["_id"]}, {"$set": update}, session=s)
            doc = await self.db.rollouts.find_one({"_id": body.deployment_id}, session=s)
            if doc is not None and doc["phase"] in OPEN and device["_id"] in doc["device_ids"]:
                r, effects = rollout.observe(
                    rollout_of(doc), device["_id"], body.state, body.reason, now
                )
                await self._apply(tx, doc, r, effects, now)

        await self.store.transaction(tx_body)

    async def round(self) -> None:
        """Devices past their timeout fail (and their rollout may stop or go on)."""
        now = self.clock()
        for doc in await self.db.rollouts.find({"phase": {"$in": OPEN}}, {"_id": 1}).to_list(None):
            await self._expire(doc["_id"], now)

    async def _expire(self, rollout_id: str, now: datetime) -> None:
        async def tx_body(tx: Transaction) -> None:
            doc = await self.db.rollouts.find_one({"_id": rollout_id}, session=tx.session)
            if doc is None:
                return
            before = rollout_of(doc)
            r, effects = rollout.expire(before, now)
            if r != before:
                await self._apply(tx, doc, r, effects, now)

        await self.store.transaction(tx_body)

    # --- the state machine's results ----------------------------------------------------

    async def _apply(
        self, tx: Transaction, doc: Doc, r: Rollout, effects: list[Effect], now: datetime
    ) -> Doc:
        """Store the rollout, bring its devices' shown states along and tell the devices."""
        before = {t.device_id: t for t in rollout_of(doc).targets}
        new = {**doc, **rollout_doc(r)}
        await self.db.rollouts.replace_one({"_id": doc["_id"]}, new, session=tx.session)
        for t in r.targets:
            if before.get(t.device_id) != t and t.state in (
                DeployState.failed,
                DeployState.cancelled,
            ):
                await self._mark(tx, t.device_id, r.rollout_id, t.state, t.reason)
        spec = DeviceConfigSpec.model_validate(doc["spec"])
        for effect in effects:
            device = await self.db.devices.find_one({"_id": effect.device_id}, session=tx.session)
            if device is None or device["state"] == DeviceState.removed.value:
                continue
            if isinstance(effect, Deploy):
                pending = {"config_name": doc["config"], "spec": doc["spec"]}
                await self._mark(
                    tx, device["_id"], r.rollout_id, DeployState.pending, None, pending
                )
                cmd = ApplyDeviceConfig(
                    minion_id=device["minion_id"],
                    deployment_id=r.rollout_id,
                    config_name=doc["config"],
                    config=spec,
                )
                emit(tx, cmd, msg_id=f"{r.rollout_id}:{device['_id']}:deploy")
            elif isinstance(effect, Revert):
                emit(
                    tx,
                    _revert(device, r.rollout_id),
                    msg_id=f"{r.rollout_id}:{device['_id']}:revert",
                )
        return new

    async def _mark(
        self,
        tx: Transaction,
        device_id: str,
        rollout_id: str,
        state: DeployState,
        reason: str | None,
        pending: Doc | None = None,
    ) -> None:
        update: Doc = {
            "deployment_id": rollout_id,
            "deploy_state": state.value,
            "deploy_reason": reason,
        }
        if pending is not None:
            update["pending"] = pending
        # an end (failed, cancelled) is shown only while the device is still this rollout's
        query: Doc = {"_id": device_id}
        if state in (DeployState.failed, DeployState.cancelled):
            query["deployment_id"] = rollout_id
        await self.db.devices.update_one(query, {"$set": update}, session=tx.session)

    async def _view(self, doc: Doc) -> RolloutView:
        names = {
            d["_id"]: d["name"]
            async for d in self.db.devices.find({"_id": {"$in": doc["device_ids"]}}, {"name": 1})
        }
        return rollout_view(doc, names)


def _revert(device: Doc, rollout_id: str) -> ApplyDeviceConfig:
    """Back to what the device last ran to `running` (nothing, if it never did)."""
    good = device.get("last_good") or {}
    spec = good.get("spec")
    return ApplyDeviceConfig(
        minion_id=device["minion_id"],
        deployment_id=f"{rollout_id}-revert",
        config_name=good.get("config_name"),
        config=DeviceConfigSpec.model_validate(spec) if spec else None,
    )


_ORDER = {s: i for i, s in enumerate(("waiting", "pending", "downloading", "starting", "running"))}


def _moves(current: str | None, reported: DeployState) -> bool:
    """Whether a report moves the device's shown state on (an older report arriving late
    does not move it back; a failure or a cancel is final for the deployment)."""
    if current in (DeployState.failed.value, DeployState.cancelled.value):
        return False
    if reported == DeployState.failed:
        return True
    if reported.value not in _ORDER:
        return False
    return _ORDER[reported.value] >= _ORDER.get(current or "waiting", 0)
