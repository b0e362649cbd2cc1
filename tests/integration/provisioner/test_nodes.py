"""The provisioner over the real bus and database: providers, regions, nodes, R-NODE-4,
maintenance, storage replacement, removal and liveness (lost and back)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import nats
import pytest
from gpufleet_auth.creds import new_user_key, public
from gpufleet_auth.tokens import JoinToken
from gpufleet_bus import BusSettings, Ports, make_broker, publish
from gpufleet_bus.streams import node_consumer
from gpufleet_contracts import subjects
from gpufleet_contracts.clock import Clock, utcnow
from gpufleet_contracts.identity import EnrollNode
from gpufleet_contracts.nodes import (
    DriveInfo,
    GpuInfo,
    GpuSample,
    HardwareInventory,
    NicInfo,
    NodeHeartbeat,
    RegisterNode,
    XidEvent,
)
from gpufleet_devstack import EmbeddedMongo, NatsServer, wait_for_async
from gpufleet_node_agent.enrol import EnrolmentError, enrol
from gpufleet_provisioner.app import build_app
from gpufleet_provisioner.settings import ProvisionerSettings
from nats.aio.client import Client
from nats.js.errors import NotFoundError

from ..conftest import JsPublisher, running, store_for

TEST_NODE_LOG_BYTES = 8 * 1024 * 1024


def good_hw(**kw: Any) -> HardwareInventory:
    base: dict[str, Any] = {
        "drives": [
            DriveInfo(name="nvme0n1", kind="nvme", size_gb=1000),
            DriveInfo(name="nvme1n1", kind="nvme", size_gb=1000),
            *[DriveInfo(name=f"sd{c}", kind="sata", size_gb=2000) for c in "abc"],
        ],
        "tpm_version": "2.0",
        "nics": [NicInfo(name="eth0", speed_mbps=10000)],
        "memory_mb": 131072,
        "cpu_cores": 16,
    }
    return HardwareInventory(**{**base, **kw})


def registration(minion: str, account: str, region: str, **kw: Any) -> RegisterNode:
    gpus = [
        GpuInfo(
            index=i,
            uuid=f"GPU-{minion}-{i}",
            model="RTX 3090",
            nvml_name="NVIDIA GeForce RTX 3090",
            memory_mb=24576,
            pcie_gen=4,
            pcie_width=16,
        )
        for i in range(2)
    ]
    base: dict[str, Any] = {
        "minion_id": minion,
        "name": minion,
        "region": region,
        "owner": account,
        "hostname": "h",
        "gpus": gpus,
        "simulated": True,
        "inventory_source": "test",
        "agent_started_at": datetime.now(UTC),
        "hardware": good_hw(),
        "heartbeat_s": 0.2,
    }
    return RegisterNode(**{**base, **kw})


class Bus:
    """The test's hands: a user of `account` (requests), an operator (watches events), and
    each node it enrols (a join token exchanged for the node's own credential)."""

    def __init__(self, server: NatsServer, nc: Client, user: Client, account: str) -> None:
        self.server = server
        self.nc = nc  # operator
        self.user = user
        self.account = account
        self.events: list[dict[str, Any]] = []
        self.nodes: dict[str, Client] = {}

    async def ask(self, verb: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        reply = await self.user.request(
            subjects.as_account(subjects.rpc("provisioner", verb), self.account),
            json.dumps(body or {}).encode(),
            timeout=10,
        )
        data: dict[str, Any] = json.loads(reply.data)
        return data

    async def region(self, name: str) -> None:
        """This account's physical region `name`, made if missing (a join token names one
        that exists)."""
        await self.ask("enable_provider", {"provider": "physical"})  # again: a conflict
        await self.ask("create_region", {"name": name})  # again: a conflict

    async def node(self, minion: str, region: str) -> Client:
        """The connection of node `minion`, enrolled in `region` of this account."""
        if minion not in self.nodes:
            await self.region(region)
            reply = await self.nc.request(
                subjects.admin("provisioner", "issue_join_token"),
                json.dumps(
                    {"account": self.account, "minion_id": minion, "region": region}
                ).encode(),
                timeout=10,
            )
            token = json.loads(reply.data)["token"]
            path = self.server.authority.directory / "test-nodes" / f"{minion}.creds"
            await enrol([self.server.url], token, minion, path, attempts=3)
            self.nodes[minion] = await nats.connect(self.server.url, **NatsServer.client(path))
        return self.nodes[minion]

    async def token(self, minion: str, region: str = "lab", account: str | None = None) -> Any:
        """The admin's answer to a join token for `minion` of `account` (this one's)."""
        if account is None:
            await self.region(region)
        body = {"account": account or self.account, "minion_id": minion, "region": region}
        reply = await self.nc.request(
            subjects.admin("provisioner", "issue_join_token"), json.dumps(body).encode(), timeout=10
        )
        return json.loads(reply.data)

    async def send(self, msg: Any) -> None:
        """A node's message, sent by that node (enrolled in the message's region)."""
        nc = await self.node(msg.minion_id, getattr(msg, "region", "lab"))
        await publish(JsPublisher(nc), msg, source="test")

    async def close(self) -> None:
        for nc in (*self.nodes.values(), self.user, self.nc):
            await nc.close()

    def states(self, minion: str) -> list[str]:
        return [e["state"] for e in self.events if e.get("minion_id") == minion]


@asynccontextmanager
async def provisioner(
    nats_server: NatsServer,
    mongo_server: EmbeddedMongo,
    db_prefix: str,
    clock: Clock = utcnow,
    **settings: Any,
) -> AsyncIterator[Bus]:
    values: dict[str, Any] = {
        "node_lost_min_s": 0.6,
        "provisioner_tick_s": 0.2,
        "auto_activate_nodes": False,
        # each node's log stream reserves this in the session's server (8 GiB in all)
        "node_log_max_bytes": TEST_NODE_LOG_BYTES,
        **settings,
    }
    config = ProvisionerSettings(auth_dir=nats_server.authority.directory, **values)
    bus_settings = BusSettings(
        nats_url=nats_server.url, nats_creds=nats_server.creds("service", "provisioner")
    )
    svc = build_app(
        Ports(
            make_broker("provisioner", bus_settings),
            store_for("provisioner", mongo_server.url, db_prefix),
            bus=bus_settings,
            clock=clock,
        ),
        config,
    )
    account = f"acct-{uuid.uuid4().hex[:6]}"
    nc = await nats.connect(nats_server.url, **nats_server.admin())
    user = await nats.connect(
        nats_server.url, **nats_server.client(nats_server.creds("user", "u", account=account))
    )
    bus = Bus(nats_server, nc, user, account)

    async def on_event(msg: Any) -> None:
        bus.events.append(json.loads(msg.data))

    await nc.subscribe(subjects.event("node", "state_changed"), cb=on_event)
    await nc.subscribe(subjects.event("node", "registered"), cb=on_event)
    try:
        async with running(svc.app):
            yield bus
    finally:
        await bus.close()


async def node(bus: Bus, ref: str) -> dict[str, Any]:
    return await bus.ask("show_node", {"node": ref})


async def test_physical_provider_region_and_node_lifecycle(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    async with provisioner(nats_server, mongo_server, db_prefix) as bus:
        # R-PROV-1: stripe is coming soon; credits once.
        refused = await bus.ask(
            "enable_provider", {"provider": "physical", "payment_mode": "stripe"}
        )
        assert refused["ok"] is False and refused["error"]["fields"][0]["rule"] == "R-PROV-1"
        assert (await bus.ask("enable_provider", {"provider": "physical"}))[
            "payment_mode"
        ] == "credits"
        again = await bus.ask("enable_provider", {"provider": "physical"})
        assert again["error"]["code"] == "conflict"
        # R-REG-1
        bad = await bus.ask("create_region", {"name": "Lab_1"})
        assert bad["error"]["fields"][0]["rule"] == "R-REG-1"
        region = await bus.ask("create_region", {"name": "lab-1"})
        assert (region["storage_mode"], region["allow_public_jobs"]) == ("local", False)
        assert (await bus.ask("create_region", {"name": "lab-1"}))["error"]["code"] == "conflict"

        m = f"m-{uuid.uuid4().hex[:6]}"
        added = await bus.ask(
            "add_node", {"region": "lab-1", "name": "box", "minion_id": m, "kind": "compute"}
        )
        assert added["state"] == "provisioning"
        await bus.send(registration(m, bus.account, "lab-1"))

        async def in_maintenance() -> bool:
            return (await node(bus, m))["state"] == "maintenance"

        await wait_for_async(in_maintenance, timeout=10)  # R-NODE-2: lands in maintenance
        # Maintenance on or off says what it wants: asked twice, the second changes nothing.
        off = {"node": "box", "maintenance": False}
        activated = await bus.ask("set_maintenance", off)
        assert (activated["state"], activated["changed"]) == ("active", True)
        again = await bus.ask("set_maintenance", off)
        assert (again["state"], again["changed"]) == ("active", False)
        on = {"node": m, "maintenance": True}
        assert (await bus.ask("set_maintenance", on))["state"] == "maintenance"
        assert (await bus.ask("set_maintenance", on))["changed"] is False
        await bus.ask("set_maintenance", {"node": m, "maintenance": False})
        # the toggle is gone: a request without the state wanted is refused
        assert (await bus.ask("set_maintenance", {"node": m}))["error"]["code"] == "invalid"

        assert [n["minion_id"] for n in (await bus.ask("list_nodes"))["nodes"]] == [m]
        removed = await bus.ask("remove_node", {"node": m})
        assert removed["state"] == "removed"
        # A removed node leaves the list; it is still shown alone, and listed when asked for.
        assert (await bus.ask("list_nodes"))["nodes"] == []
        listed = (await bus.ask("list_nodes", {"include_removed": True}))["nodes"]
        assert [(n["minion_id"], n["state"]) for n in listed] == [(m, "removed")]
        assert (await node(bus, m))["state"] == "removed"
        await asyncio.sleep(0.5)
        changed = [e for e in bus.events if e.get("minion_id") == m and "workers" in e]
        assert [e["state"] for e in changed] == ["active", "maintenance", "active", "removed"]
        assert changed[-1]["workers"] == "requeue"


async def test_failing_hardware_stays_out_of_service_with_every_reason(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    async with provisioner(nats_server, mongo_server, db_prefix) as bus:
        await bus.ask("enable_provider", {"provider": "physical"})
        await bus.ask("create_region", {"name": "lab"})
        m = f"bad-{uuid.uuid4().hex[:6]}"
        await bus.ask("add_node", {"region": "lab", "name": "bad", "minion_id": m})
        weak = good_hw(
            tpm_version=None, drives=[DriveInfo(name="nvme0n1", kind="nvme", size_gb=500)]
        )
        await bus.send(registration(m, bus.account, "lab", hardware=weak))

        async def checked() -> bool:
            return bool((await node(bus, m))["failed_rules"])

        await wait_for_async(checked, timeout=10)
        shown = await node(bus, m)
        assert shown["state"] == "maintenance"
        assert [r.split(":")[0] for r in shown["failed_rules"]] == [
            "R-NODE-4.nvme-count",
            "R-NODE-4.nvme-size",
            "R-NODE-4.tpm",
            "R-NODE-4.sata",
        ]
        refused = await bus.ask("set_maintenance", {"node": m, "maintenance": False})
        assert refused["error"]["code"] == "conflict" and "TPM 2.0" in refused["error"]["message"]
        listed = await bus.ask("list_nodes")
        assert listed["nodes"][0]["failed_rules"] == shown["failed_rules"]


async def test_waived_hardware_rules_are_kept_and_shown_but_hold_nothing(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    """Development on a VM with a real GPU (no NVMe, no TPM): GPUFLEET_WAIVE_HARDWARE_RULES."""
    settings = {"waive_hardware_rules": True, "auto_activate_nodes": True}
    async with provisioner(nats_server, mongo_server, db_prefix, **settings) as bus:
        await bus.ask("enable_provider", {"provider": "physical"})
        await bus.ask("create_region", {"name": "lab"})
        m = f"vm-{uuid.uuid4().hex[:6]}"
        await bus.ask("add_node", {"region": "lab", "name": "vm", "minion_id": m})
        await bus.send(registration(m, bus.account, "lab", hardware=good_hw(tpm_version=None)))

        async def active() -> bool:
            return (await node(bus, m))["state"] == "active"

        await wait_for_async(active, timeout=10)
        assert [r.split(":")[0] for r in (await node(bus, m))["failed_rules"]] == ["R-NODE-4.tpm"]
        await bus.ask("set_maintenance", {"node": m, "maintenance": True})
        back = await bus.ask("set_maintenance", {"node": m, "maintenance": False})
        assert back["state"] == "active", back


async def test_simulated_and_gpu_less_nodes_are_stored_and_listed_as_such(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    async with provisioner(nats_server, mongo_server, db_prefix) as bus:
        await bus.ask("enable_provider", {"provider": "physical"})
        await bus.ask("create_region", {"name": "lab"})
        sim, bare = f"sim-{uuid.uuid4().hex[:6]}", f"bare-{uuid.uuid4().hex[:6]}"
        no_driver = "nvml: no NVIDIA driver (Driver Not Loaded)"
        await bus.send(registration(sim, bus.account, "lab", inventory_source="/sim/2x.json"))
        await bus.send(
            registration(
                bare,
                bus.account,
                "lab",
                gpus=[],
                simulated=False,
                inventory_source=no_driver,
                cpu_job_cpus=64,  # more than its 16 CPUs: it offers what it has (R-JOB-2)
                price_per_cpu_hour="0.02",
            )
        )

        async def both_registered() -> bool:
            return len((await bus.ask("list_nodes"))["nodes"]) == 2

        await wait_for_async(both_registered, timeout=10)
        listed = {n["minion_id"]: n for n in (await bus.ask("list_nodes"))["nodes"]}
        assert (listed[sim]["simulated"], len(listed[sim]["gpus"])) == (True, 2)
        assert listed[sim]["inventory_source"] == "/sim/2x.json"
        assert (listed[bare]["simulated"], listed[bare]["gpus"]) == (False, [])
        assert listed[bare]["inventory_source"] == no_driver
        assert (await node(bus, bare))["simulated"] is False
        assert (await node(bus, sim))["simulated"] is True

        async def announced() -> bool:
            return len([e for e in bus.events if "gpus" in e]) == 2

        await wait_for_async(announced, timeout=10)  # NodeRegistered tells the scheduler
        flags = {e["minion_id"]: e["simulated"] for e in bus.events if "gpus" in e}
        assert flags == {sim: True, bare: False}
        cpus = {
            e["minion_id"]: (e["cpu_count"], e["cpu_job_cpus"], e["price_per_cpu_hour"])
            for e in bus.events
            if "gpus" in e
        }
        assert cpus == {sim: (16, 0, None), bare: (16, 16, "0.02")}


async def test_storage_nodes_one_per_region_and_central_needs_one_first(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    async with provisioner(nats_server, mongo_server, db_prefix) as bus:
        await bus.ask("enable_provider", {"provider": "physical"})
        await bus.ask("create_region", {"name": "dc", "storage_mode": "central"})
        early = await bus.ask("add_node", {"region": "dc", "name": "c1", "minion_id": "c1-x"})
        assert (
            early["error"]["code"] == "conflict" and "central storage" in early["error"]["message"]
        )
        s1 = await bus.ask(
            "add_node",
            {"region": "dc", "name": "s1", "minion_id": f"s1-{db_prefix}", "kind": "storage"},
        )
        assert s1["state"] == "active"  # R-NODE-3: storage nodes become active by themselves
        second = {"region": "dc", "name": "s2", "minion_id": f"s2-{db_prefix}", "kind": "storage"}
        refused = await bus.ask("add_node", second)
        assert refused["error"]["code"] == "conflict" and "replace" in refused["error"]["message"]
        replaced = await bus.ask("add_node", {**second, "replace": True})
        assert replaced["state"] == "active"
        assert (await node(bus, "s1"))["state"] == "removed"
        ok = await bus.ask(
            "add_node", {"region": "dc", "name": "c1", "minion_id": f"c1-{db_prefix}"}
        )
        assert ok["state"] == "provisioning"


async def test_a_silent_node_is_lost_and_comes_back(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    async with provisioner(nats_server, mongo_server, db_prefix, auto_activate_nodes=True) as bus:
        m = f"hb-{uuid.uuid4().hex[:6]}"
        await bus.send(registration(m, bus.account, "auto"))  # development: self-registers

        async def active() -> bool:
            return "active" in bus.states(m)

        await wait_for_async(active, timeout=10)

        # no heartbeats: lost after max(0.6 s, 3 x 0.2 s) (+ the provisioner's start grace)
        async def lost() -> bool:
            return "lost" in bus.states(m)

        await wait_for_async(lost, timeout=10)
        event = next(e for e in bus.events if e.get("minion_id") == m and e["state"] == "lost")
        assert event["workers"] == "requeue" and "no heartbeat" in event["reason"]
        assert event["previous"] == "active"
        now = datetime.now(UTC)
        gpu = GpuSample(
            index=0,
            temperature_c=95,
            ecc_aggregate_uncorrected=2,
            retired_pages=1,
            xid_events=[XidEvent(xid=79, at=now)],
        )
        hb = NodeHeartbeat(minion_id=m, at=now, gpus=[gpu], disk_used_pct=42.5)
        await (await bus.node(m, "auto")).publish(subjects.heartbeat(m), hb.to_bytes())

        async def back() -> bool:
            return bus.states(m)[-1:] == ["active"] and len(bus.states(m)) >= 3

        await wait_for_async(back, timeout=10)
        shown = await node(bus, m)
        assert shown["state"] == "active"
        # its telemetry kept whole: ECC, retired pages, XIDs, the disk (R-NODE-6)
        kept = NodeHeartbeat.model_validate(shown["telemetry"])
        assert kept.gpus == [gpu] and kept.disk_used_pct == 42.5


async def test_a_heartbeat_naming_another_node_refreshes_nothing(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    """Node `evil` publishes, on its own subject, a heartbeat naming the victim node: the
    victim stays lost and its last_seen is unchanged (the node is the subject's)."""
    async with provisioner(nats_server, mongo_server, db_prefix, auto_activate_nodes=True) as bus:
        m, evil = f"hbv-{uuid.uuid4().hex[:6]}", f"hbe-{uuid.uuid4().hex[:6]}"
        await bus.send(registration(m, bus.account, "auto"))

        async def lost() -> bool:
            return "lost" in bus.states(m)

        await wait_for_async(lost, timeout=10)
        db = store_for("provisioner", mongo_server.url, db_prefix).db
        before = await db.nodes.find_one({"minion_id": m})
        assert before is not None
        spoof = NodeHeartbeat(minion_id=m, at=datetime.now(UTC), running=["w-1"])
        attacker = await bus.node(evil, "auto")
        for _ in range(3):
            await attacker.publish(subjects.heartbeat(evil), spoof.to_bytes())
        await attacker.flush()
        await asyncio.sleep(1.0)
        after = await db.nodes.find_one({"minion_id": m})
        assert after is not None
        assert after["last_seen_ms"] == before["last_seen_ms"]
        assert after.get("busy") == before.get("busy")
        assert after["state"] == "lost" and bus.states(m)[-1] == "lost"


async def test_a_minion_id_of_another_account_gets_no_join_token(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    """A minion id another account has a node of, or an unspent token for, is taken."""
    async with provisioner(nats_server, mongo_server, db_prefix) as bus:
        other = f"acct-{uuid.uuid4().hex[:6]}"
        await bus.ask("enable_provider", {"provider": "physical"})
        await bus.ask("create_region", {"name": "lab"})
        added, promised = f"ad-{uuid.uuid4().hex[:6]}", f"pr-{uuid.uuid4().hex[:6]}"
        assert (await bus.ask("add_node", {"region": "lab", "name": "a", "minion_id": added}))[
            "state"
        ] == "provisioning"
        assert "token" in await bus.token(promised)
        for minion in (added, promised):
            refused = await bus.token(minion, account=other)
            assert refused["error"]["code"] == "conflict", refused
        assert "token" in await bus.token(promised)  # the same account may ask again


async def test_an_enrolment_racing_another_accounts_is_refused(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    """Another account's enrolment written between token and enrolment (a race): the
    enrolment is refused as an unknown token's (the other account's node is not revealed),
    no consumer is made and the other account's row is untouched."""
    async with provisioner(nats_server, mongo_server, db_prefix) as bus:
        m = f"race-{uuid.uuid4().hex[:6]}"
        token = (await bus.token(m))["token"]
        db = store_for("provisioner", mongo_server.url, db_prefix).db
        row = {
            "_id": m,
            "account": "acct-other",
            "region": "x",
            "public_key": "UX",
            "state": "active",
        }
        await db.enrolments.insert_one(dict(row))
        path = nats_server.authority.directory / "test-nodes" / f"{m}.creds"
        with pytest.raises(EnrolmentError, match="no such join token"):
            await enrol([nats_server.url], token, m, path, attempts=1)
        assert await db.enrolments.find_one({"_id": m}) == row
        with pytest.raises(NotFoundError):
            await bus.nc.jetstream().consumer_info(subjects.STREAM_COMMANDS, node_consumer(m))


async def test_removing_a_node_revokes_only_the_accounts_own_enrolment(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    """Account B adds a node with the minion id account A enrolled (before A registered
    it) and removes it: A's enrolment, consumer and connection stay."""
    async with provisioner(nats_server, mongo_server, db_prefix) as a:
        m = f"rv-{uuid.uuid4().hex[:6]}"
        node_a = await a.node(m, "lab")
        b_account = f"acct-{uuid.uuid4().hex[:6]}"
        b = await nats.connect(
            nats_server.url,
            **nats_server.client(nats_server.creds("user", "u", account=b_account)),
        )

        async def ask_b(verb: str, body: dict[str, Any]) -> dict[str, Any]:
            subject = subjects.as_account(subjects.rpc("provisioner", verb), b_account)
            reply = await b.request(subject, json.dumps(body).encode(), timeout=10)
            data: dict[str, Any] = json.loads(reply.data)
            return data

        try:
            await ask_b("enable_provider", {"provider": "physical"})
            await ask_b("create_region", {"name": "lab"})
            added = await ask_b("add_node", {"region": "lab", "name": "x", "minion_id": m})
            assert added["state"] == "provisioning", added
            assert (await ask_b("remove_node", {"node": m}))["state"] == "removed"
        finally:
            await b.close()
        db = store_for("provisioner", mongo_server.url, db_prefix).db
        enrolment = await db.enrolments.find_one({"_id": m})
        assert enrolment is not None
        assert (enrolment["account"], enrolment["state"]) == (a.account, "active")
        await a.nc.jetstream().consumer_info(subjects.STREAM_COMMANDS, node_consumer(m))
        await asyncio.sleep(0.5)
        assert node_a.is_connected
        await node_a.publish(subjects.heartbeat(m), b"{}")
        await node_a.flush(timeout=5)


async def test_a_re_enrolled_node_gets_only_commands_from_its_enrolment_on(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    """A command retained from before a (re-)enrolment is not delivered to the new host;
    one published right after the enrolment is."""
    async with provisioner(nats_server, mongo_server, db_prefix) as bus:
        m = f"re-{uuid.uuid4().hex[:6]}"
        await bus.node(m, "lab")
        js = bus.nc.jetstream()
        subject = f"{subjects.COMMANDS}.node.{m}.start_worker"
        await js.publish(subject, b"old")
        path = nats_server.authority.directory / "test-nodes" / f"{m}-again.creds"
        await enrol([nats_server.url], (await bus.token(m))["token"], m, path, attempts=3)
        await js.publish(subject, b"new")
        sub = await js.pull_subscribe_bind(node_consumer(m), subjects.STREAM_COMMANDS)
        msgs = await sub.fetch(5, timeout=2)
        assert [msg.data for msg in msgs] == [b"new"]


async def test_a_revoked_or_rotated_user_credential_is_cut_off_at_once(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str, tmp_path: Any
) -> None:
    """An operator adds a user (its credential comes back once), adds it again (the first
    credential is revoked: rotation), then revokes it: each time the old connection is
    closed by the server and cannot come back."""
    from gpufleet_auth import Creds

    async def admin(verb: str, body: dict[str, Any]) -> dict[str, Any]:
        subject = subjects.admin("provisioner", verb)
        reply = await bus.nc.request(subject, json.dumps(body).encode(), timeout=10)
        data: dict[str, Any] = json.loads(reply.data)
        return data

    async def connected_as(reply: dict[str, Any], name: str) -> Client:
        path = Creds.parse(reply["creds"]).write(tmp_path / f"{name}.creds")
        return await nats.connect(nats_server.url, allow_reconnect=False, **NatsServer.client(path))

    async with provisioner(nats_server, mongo_server, db_prefix) as bus:
        account = f"acct-{uuid.uuid4().hex[:6]}"
        await admin("create_account", {"account": account, "plan": "free"})
        first = await connected_as(await admin("add_user", {"account": account, "user": "al"}), "a")
        second_reply = await admin("add_user", {"account": account, "user": "al"})  # rotate
        await wait_for_async(lambda: first.is_closed, timeout=5)
        second = await connected_as(second_reply, "b")
        revoked = await admin("revoke_user", {"account": account, "user": "al"})
        assert revoked == {"account": account, "user": "al", "revoked": True}
        await wait_for_async(lambda: second.is_closed, timeout=5)
        with pytest.raises(nats.errors.Error):
            await connected_as(second_reply, "c")
        listed = await admin("list_accounts", {})
        mine = next(a for a in listed["accounts"] if a["account"] == account)
        assert mine["users"] == []
        unknown = await admin("revoke_user", {"account": account, "user": "nobody"})
        assert unknown["error"]["code"] == "not_found"


async def test_an_enrolment_naming_another_minion_on_its_own_subject_is_refused(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str, tmp_path: Any
) -> None:
    """A token for one minion, sent on its own `enroll.<minion>` subject but naming another
    minion in the body: refused as invalid (the subject names who asks), no credential, the
    token unspent."""
    async with provisioner(nats_server, mongo_server, db_prefix) as bus:
        m, other = f"en-{uuid.uuid4().hex[:6]}", f"eo-{uuid.uuid4().hex[:6]}"
        token = JoinToken.parse((await bus.token(m))["token"])
        cmd = EnrollNode(minion_id=other, secret=token.secret, public_key=public(new_user_key()))
        path = token.creds.write(tmp_path / "enrol.creds")
        nc = await nats.connect(nats_server.url, **NatsServer.client(path))
        try:
            msg = await nc.request(subjects.enroll(m), cmd.to_bytes(), timeout=10)
        finally:
            await nc.close()
        reply = json.loads(msg.data)
        assert reply["ok"] is False and reply["error"]["code"] == "invalid", reply
        assert reply["error"]["fields"][0]["rule"] == "R-NODE-2"
        db = store_for("provisioner", mongo_server.url, db_prefix).db
        assert await db.enrolments.find_one({"_id": {"$in": [m, other]}}) is None
        spare = await db.join_tokens.find_one({"minion_id": m})
        assert spare is not None and spare["used_at_ms"] is None


async def test_a_join_token_names_an_existing_physical_region_of_its_account(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    """Enrolment checks what `node add` checks: the region exists (by owner and name), and
    an account's own token is for a physical region (issue 30, item 1)."""
    async with provisioner(nats_server, mongo_server, db_prefix) as bus:
        m = f"jt-{uuid.uuid4().hex[:6]}"
        for refused in (
            await bus.ask("issue_join_token", {"minion_id": m, "region": "nowhere"}),
            json.loads(
                (
                    await bus.nc.request(
                        subjects.admin("provisioner", "issue_join_token"),
                        json.dumps(
                            {"account": bus.account, "minion_id": m, "region": "nowhere"}
                        ).encode(),
                        timeout=10,
                    )
                ).data
            ),
        ):
            field = refused["error"]["fields"][0]
            assert (field["field"], field["rule"]) == ("region", "R-NODE-2"), refused
        await bus.region("lab")
        assert "token" in await bus.ask("issue_join_token", {"minion_id": m, "region": "lab"})


async def test_an_enrolled_node_of_a_central_region_waits_for_its_storage_node(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    """A node joining by token a central region without an active storage node is held in
    maintenance with R-NODE-3 shown, as `node add` refuses it; once the storage node is
    active the operator can take it out of maintenance (checked again, not remembered)."""
    async with provisioner(nats_server, mongo_server, db_prefix) as bus:
        await bus.ask("enable_provider", {"provider": "physical"})
        await bus.ask("create_region", {"name": "dc", "storage_mode": "central"})
        m = f"cn-{uuid.uuid4().hex[:6]}"
        await bus.send(registration(m, bus.account, "dc"))

        async def registered() -> bool:
            shown = await node(bus, m)
            return "error" not in shown and shown["state"] == "maintenance"

        await wait_for_async(registered, timeout=10)
        shown = await node(bus, m)
        assert any(r.startswith("R-NODE-3.storage-node") for r in shown["failed_rules"]), shown
        held = await bus.ask("set_maintenance", {"node": m, "maintenance": False})
        assert held["error"]["code"] == "conflict" and "R-NODE-3" in held["error"]["message"]
        storage = {"region": "dc", "name": "s", "minion_id": f"s-{db_prefix}", "kind": "storage"}
        assert (await bus.ask("add_node", storage))["state"] == "active"
        freed = await bus.ask("set_maintenance", {"node": m, "maintenance": False})
        assert freed["state"] == "active", freed
