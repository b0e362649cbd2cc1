"""device-fleet with the provisioner on the real servers: devices only in a central region
with an active storage node, enrolled with a one-time token whose credential speaks only for
its own device, active at their first report; configurations per region; a rollout driven by
the devices' own reports (canary first, stopped by a failed canary, cancelled mid-way with no
device left in progress); DeviceAdded / DeviceRemoved for billing."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats
from gpufleet_bus import BusSettings, Ports, make_broker, publish
from gpufleet_contracts import subjects
from gpufleet_contracts.devices import ApplyDeviceConfig, DeployState, DeviceStatusReported
from gpufleet_device_fleet.app import DeviceFleetSettings, build_app
from gpufleet_devstack import EmbeddedMongo, NatsServer, wait_for_async
from gpufleet_node_agent.enrol import enrol
from nats.aio.client import Client

from ..conftest import JsPublisher, running, store_for
from ..provisioner.test_nodes import Bus, provisioner

S = DeployState


class Fleet:
    """The test's hands on device-fleet: the provisioner's Bus (a user, an operator) plus
    device-fleet's requests and each enrolled device's own connection."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.devices: dict[str, Client] = {}
        self.creds: dict[str, Path] = {}
        self.events: list[dict[str, Any]] = []

    async def ask(
        self,
        verb: str,
        body: dict[str, Any] | None = None,
        user: Client | None = None,
        account: str | None = None,
    ) -> dict[str, Any]:
        subject = subjects.as_account(
            subjects.rpc("device-fleet", verb), account or self.bus.account
        )
        reply = await (user or self.bus.user).request(
            subject, json.dumps(body or {}).encode(), timeout=10
        )
        data: dict[str, Any] = json.loads(reply.data)
        return data

    async def central(self, name: str) -> None:
        """A central region of this account with its active storage node."""
        await self.bus.ask("enable_provider", {"provider": "physical"})
        made = await self.bus.ask("create_region", {"name": name, "storage_mode": "central"})
        assert made.get("storage_mode") == "central", made
        storage = {
            "region": name,
            "name": f"st-{name}",
            "minion_id": f"st-{uuid.uuid4().hex[:8]}",
            "kind": "storage",
        }
        assert (await self.bus.ask("add_node", storage))["state"] == "active"

    async def enrolled(self, device: str, workdir: Path) -> Client:
        """The device's own connection: a join token from `device token`, exchanged."""
        issued = await self.ask("issue_token", {"device": device})
        assert "token" in issued, issued
        path = workdir / f"{issued['minion_id']}.creds"
        await enrol([self.bus.server.url], issued["token"], issued["minion_id"], path, attempts=3)
        nc = await nats.connect(self.bus.server.url, **NatsServer.client(path))
        self.devices[issued["minion_id"]] = nc
        self.creds[issued["minion_id"]] = path
        return nc

    async def report(
        self,
        minion: str,
        state: DeployState,
        deployment: str | None = None,
        inference: str | None = None,
        reason: str | None = None,
    ) -> None:
        msg = DeviceStatusReported(
            minion_id=minion,
            deployment_id=deployment,
            state=state,
            inference=inference,
            reason=reason,
            at=datetime.now(UTC),
        )
        await publish(JsPublisher(self.devices[minion]), msg, source="test")

    async def device(self, ref: str) -> dict[str, Any]:
        return await self.ask("show_device", {"device": ref})

    async def until(self, ref: str, **want: Any) -> dict[str, Any]:
        async def reached() -> bool:
            got = await self.device(ref)
            return all(got.get(k) == v for k, v in want.items())

        await wait_for_async(reached, timeout=20)  # a deployment stages, then waits out a grace
        return await self.device(ref)

    async def rollout(self, rid: str) -> dict[str, Any]:
        return await self.ask("show_rollout", {"rollout_id": rid})

    async def close(self) -> None:
        for nc in self.devices.values():
            await nc.close()


@asynccontextmanager
async def fleet(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str
) -> AsyncIterator[Fleet]:
    bus_settings = BusSettings(
        nats_url=nats_server.url, nats_creds=nats_server.creds("service", "device-fleet")
    )
    svc = build_app(
        Ports(
            make_broker("device-fleet", bus_settings),
            store_for("device-fleet", mongo_server.url, db_prefix),
            bus=bus_settings,
        ),
        DeviceFleetSettings(tick_s=0.2, heartbeats_s=0.2),
    )
    async with provisioner(nats_server, mongo_server, db_prefix) as bus, running(svc.app):
        f = Fleet(bus)

        async def on_event(msg: Any) -> None:
            f.events.append({"subject": msg.subject, **json.loads(msg.data)})

        await bus.nc.subscribe(subjects.event("device", "*"), cb=on_event)
        await bus.nc.subscribe(ApplyDeviceConfig.SUBJECT.format(minion_id="*"), cb=on_event)
        try:
            yield f
        finally:
            await f.close()


def minion() -> str:
    return f"jx-{uuid.uuid4().hex[:8]}"


async def test_devices_configs_and_rollouts(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str, tmp_path: Path
) -> None:
    async with fleet(nats_server, mongo_server, db_prefix) as f:
        # R-DEV-1 / R-NODE-3: a local region, then a central one without its storage node
        await f.bus.ask("enable_provider", {"provider": "physical"})
        await f.bus.ask("create_region", {"name": "loc"})
        add = {"region": "loc", "name": "d0", "minion_id": minion(), "model": "jetson-orin-nano"}
        refused = await f.ask("add_device", add)
        assert refused["error"]["fields"][0]["rule"] == "R-DEV-1", refused
        await f.bus.ask("create_region", {"name": "bare", "storage_mode": "central"})
        refused = await f.ask("add_device", {**add, "region": "bare"})
        assert refused["error"]["fields"][0]["rule"] == "R-NODE-3", refused
        assert (await f.ask("add_device", {**add, "region": "nowhere"}))["error"][
            "code"
        ] == "not_found"

        await f.central("edge")
        await f.central("edge2")
        ms = [minion() for _ in range(3)]
        for i, m in enumerate(ms):
            added = await f.ask(
                "add_device",
                {"region": "edge", "name": f"d{i}", "minion_id": m, "model": "jetson-agx-orin"},
            )
            assert added["state"] == "provisioning", added
        dup = await f.ask(
            "add_device",
            {"region": "edge", "name": "d0", "minion_id": minion(), "model": "jetson-agx-orin"},
        )
        assert (dup["error"]["code"], dup["error"]["fields"][0]["field"]) == ("conflict", "name")
        dup = await f.ask(
            "add_device",
            {"region": "edge2", "name": "x", "minion_id": ms[0], "model": "jetson-agx-orin"},
        )
        assert dup["error"]["fields"][0]["field"] == "minion_id"
        await wait_for_async(
            lambda: sum(e["subject"].endswith(".added") for e in f.events) >= 3, timeout=10
        )
        assert {e["account"] for e in f.events if e["subject"].endswith(".added")} == {
            f.bus.account
        }

        # R-DEV-2: unique per region, reusable across regions, required fields
        cfg = {
            "region": "edge",
            "name": "yolo",
            "image": "nvcr.io/l4t:r36",
            "model": "yolov8",
            "start_command": "python3 serve.py",
            "env": {"FPS": "30"},
        }
        assert (await f.ask("add_config", cfg))["name"] == "yolo"
        assert (await f.ask("add_config", cfg))["error"]["code"] == "conflict"
        assert (await f.ask("add_config", {**cfg, "region": "edge2"}))["region"] == "edge2"
        missing = await f.ask(
            "add_config", {k: v for k, v in cfg.items() if k != "start_command"} | {"name": "x"}
        )
        assert missing["error"]["fields"][0]["field"] == "start_command"
        wrong = await f.ask("set_config", {"device": "d0", "config": "nope"})
        assert wrong["error"]["fields"][0]["rule"] == "R-DEV-2"
        for i in range(3):
            assert (await f.ask("set_config", {"device": f"d{i}", "config": "yolo"}))[
                "config"
            ] == "yolo"
        assert (await f.ask("show_config", {"region": "edge", "name": "yolo"}))["devices"] == 3
        assert (await f.ask("remove_config", {"region": "edge", "name": "yolo"}))["error"][
            "code"
        ] == "conflict"

        # enrolled with a one-time token; active at the first report (R-DEV-1)
        for m in ms:
            await f.enrolled(m, tmp_path)
            await f.report(m, S.idle)
        for m in ms:
            await f.until(m, state="active")

        # deploy latest: the canary first, then the rest
        r = await f.ask(
            "deploy", {"config": "yolo", "region": "edge", "policy": {"canary": 1, "batch_size": 2}}
        )
        rid = r["rollout_id"]
        assert [d["state"] for d in r["devices"]] == ["pending", "waiting", "waiting"], r
        await wait_for_async(
            lambda: any(e.get("deployment_id") == rid for e in f.events), timeout=10
        )
        told = [e["minion_id"] for e in f.events if e.get("deployment_id") == rid]
        assert told == [ms[0]]
        for s in (S.downloading, S.starting, S.running):
            await f.report(ms[0], s, rid, inference="running" if s == S.running else None)
        d0 = await f.until("d0", deploy_state="running", inference="running")
        assert d0["deployed_at"] is not None
        await wait_for_async(
            lambda: len([e for e in f.events if e.get("deployment_id") == rid]) == 3, timeout=10
        )
        await f.report(ms[1], S.running, rid, inference="running")
        await f.report(ms[2], S.failed, rid, reason="image pull: no space left on device")
        await wait_for_async(lambda: _phase(f, rid, "stopped"), timeout=10)
        d2 = await f.device("d2")
        assert (d2["deploy_state"], d2["deploy_reason"]) == (
            "failed",
            "image pull: no space left on device",
        )

        # a failed canary stops the rollout before the rest
        r = await f.ask("deploy", {"devices": ["d2", "d1", "d0"], "policy": {"canary": 1}})
        await f.report(ms[2], S.failed, r["rollout_id"], reason="exit 1")
        stopped = await _phase(f, r["rollout_id"], "stopped")
        assert stopped["reason"].startswith(f"canary {d2['device_id']} failed: exit 1")
        assert [d["state"] for d in stopped["devices"]] == ["failed", "cancelled", "cancelled"]

        # cancelled mid-way: nothing left in progress, devices on their way told to go back
        r = await f.ask("deploy", {"devices": ["d0", "d1", "d2"], "policy": {"canary": 2}})
        rid = r["rollout_id"]
        await f.report(ms[0], S.downloading, rid)
        busy = await f.ask("deploy", {"devices": ["d0"]})
        assert busy["error"]["code"] == "conflict"
        cancelled = await f.ask("cancel_rollout", {"rollout_id": rid})
        assert cancelled["phase"] == "cancelled"
        assert {d["state"] for d in cancelled["devices"]} == {"cancelled"}
        for ref in ("d0", "d1", "d2"):
            assert (await f.device(ref))["deploy_state"] not in (
                "pending",
                "downloading",
                "starting",
                "waiting",
            )
        await wait_for_async(
            lambda: len([e for e in f.events if e.get("deployment_id") == f"{rid}-revert"]) == 2,
            timeout=10,
        )
        back = {e["minion_id"]: e for e in f.events if e.get("deployment_id") == f"{rid}-revert"}
        assert back[ms[0]]["config_name"] == "yolo"  # it ran yolo before

        # removal: DeviceRemoved, the name and minion id free again
        gone = await f.ask("remove_device", {"device": "d1"})
        assert gone["state"] == "removed"
        await wait_for_async(
            lambda: any(e["subject"].endswith(".removed") for e in f.events), timeout=10
        )
        listed = await f.ask("list_devices", {})
        assert [d["name"] for d in listed["devices"]] == ["d0", "d2"]
        again = await f.ask(
            "add_device",
            {"region": "edge", "name": "d1", "minion_id": ms[1], "model": "jetson-orin-nx"},
        )
        assert again["state"] == "provisioning", again


async def _phase(f: Fleet, rid: str, phase: str) -> dict[str, Any]:
    async def reached() -> bool:
        return (await f.rollout(rid))["phase"] == phase

    await wait_for_async(reached, timeout=10)
    return await f.rollout(rid)
