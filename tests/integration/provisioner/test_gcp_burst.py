"""The GCP half of the provisioner against the emulator, through the real client libraries:
the key (R-PROV-2), the sink/topic/subscription, regions and quotas (R-REG-2/3), bursting
(R-SCHED-3) and the lifecycle bridge, with faults: quota exhausted, insert failing,
preemption, duplicated and out-of-order log entries."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import pytest
from cryptography.fernet import Fernet
from gpufleet_bus import Ports, publish
from gpufleet_contracts import Message, subjects
from gpufleet_contracts.jobs import Demand, PendingDemandChanged
from gpufleet_contracts.nodes import GpuInfo, NodeHeartbeat, RegisterNode
from gpufleet_devstack import EmbeddedMongo, NatsServer, wait_for_async
from gpufleet_gcp_emulator.testing import EmulatorProcess, service_account_key
from gpufleet_node_agent.enrol import enrol
from gpufleet_provisioner.app import build_app
from gpufleet_provisioner.settings import ProvisionerSettings

from ..conftest import (
    AccountClient,
    JsPublisher,
    admin_connect,
    broker_for,
    connect,
    running,
    store_for,
)

PEM = service_account_key("any", "k1")["private_key"]
SECRET_MARKER = PEM.splitlines()[5]  # a line of the key's body, to look for in outputs


def key_json(project: str) -> str:
    return json.dumps(service_account_key(project, "k1", private_key=PEM))


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorProcess]:
    emu = EmulatorProcess(tmp_path_factory.mktemp("gcp") / "emulator.log", delay_s=0.2)
    emu.start()
    try:
        yield emu
    finally:
        emu.stop()


class Cloud:
    """The test's side of the provisioner, each part with its own credential: a user of a
    new account (its requests), the scheduler (pending demand), the instances' node agents
    (registration, heartbeats); an operator watches every event."""

    def __init__(self, server: NatsServer, user: AccountClient) -> None:
        self.server, self.user, self.account = server, user, user.account
        self.project = ""
        self.events: list[dict[str, Any]] = []
        self.raw: list[tuple[str, dict[str, str], bytes]] = []
        self.publishers: dict[str, JsPublisher] = {}

    async def ask(self, verb: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        return await self.user.call(
            subjects.rpc("provisioner", verb), json.dumps(body or {}).encode()
        )

    async def publisher(self, kind: str, name: str) -> JsPublisher:
        if f"{kind}:{name}" not in self.publishers:
            creds = self.server.creds(kind, name, account=self.account)
            self.publishers[f"{kind}:{name}"] = JsPublisher(await connect(self.server, creds))
        return self.publishers[f"{kind}:{name}"]

    async def agent(self, minion_id: str, region: str = "us-central1") -> JsPublisher:
        """The instance's agent, enrolled as a booted instance would be: with a join token
        for it (the provisioner puts one in the instance's metadata; the test asks for its
        own as an operator)."""
        key = f"node:{minion_id}"
        if key not in self.publishers:
            nc = await admin_connect(self.server)
            reply = await nc.request(
                subjects.admin("provisioner", "issue_join_token"),
                json.dumps(
                    {"account": self.account, "minion_id": minion_id, "region": region}
                ).encode(),
                timeout=10,
            )
            await nc.close()
            path = self.server.authority.directory / "test-nodes" / f"{minion_id}.creds"
            await enrol([self.server.url], json.loads(reply.data)["token"], minion_id, path)
            self.publishers[key] = JsPublisher(await connect(self.server, path))
        return self.publishers[key]

    async def send(self, msg: Message) -> None:
        """As its publisher would: a registration from the node's agent, pending demand
        from the scheduler."""
        if isinstance(msg, RegisterNode):
            sender = await self.agent(msg.minion_id, msg.region)
        else:
            sender = await self.publisher("service", "scheduler")
        await publish(sender, msg, source="test")

    async def close(self) -> None:
        for p in self.publishers.values():
            await p.nc.close()
        await self.user.nc.close()


@asynccontextmanager
async def provisioner(
    nats_server: NatsServer,
    mongo_server: EmbeddedMongo,
    db_prefix: str,
    emulator: EmulatorProcess,
    *,
    idle_s: float = 1.0,
) -> AsyncIterator[Cloud]:
    settings = ProvisionerSettings(
        auth_dir=nats_server.authority.directory,
        node_log_max_bytes=8 * 1024 * 1024,  # reserved per node in the session's server
        secret_key=Fernet.generate_key().decode(),
        provisioner_tick_s=0.2,
        node_lost_min_s=2.0,
        burst_idle_s=idle_s,
        burst_retry_s=60,
        gcp_compute_endpoint=emulator.compute,
        gcp_grpc_endpoint=emulator.grpc,
    )
    svc = build_app(
        Ports(
            broker_for("provisioner", nats_server),
            store_for("provisioner", mongo_server.url, db_prefix),
        ),
        settings,
    )
    account = f"acct-{uuid.uuid4().hex[:6]}"
    user = await connect(nats_server, nats_server.creds("user", "dev", account=account))
    bus = Cloud(nats_server, AccountClient(user, account))
    bus.project = f"proj-{uuid.uuid4().hex[:8]}"
    nc = await admin_connect(nats_server)  # watches every event

    async def on_event(msg: Any) -> None:
        bus.events.append(json.loads(msg.data))
        bus.raw.append((msg.subject, dict(msg.headers or {}), msg.data))

    await nc.subscribe(f"{subjects.EVENTS}.>", cb=on_event)
    try:
        async with running(svc.app):
            enabled = await bus.ask(
                "enable_provider", {"provider": "gcp", "key_json": key_json(bus.project)}
            )
            assert enabled["gcp_project_id"] == bus.project, enabled
            yield bus
    finally:
        await nc.close()
        await bus.close()


def demand(bus: Cloud, job: str, **kw: Any) -> Demand:
    base: dict[str, Any] = {
        "job_id": job,
        "worker": 0,
        "owner": bus.account,
        "project": "p",
        "gpu_types": ["V100"],
        "gpu_count": 1,
        "burst_allowed": True,
        "waiting_since": datetime.now(UTC),
    }
    return Demand(**{**base, **kw})


async def pending(bus: Cloud, *demands: Demand) -> None:
    await bus.send(PendingDemandChanged(demands=list(demands), at=datetime.now(UTC)))


async def cloud_nodes(bus: Cloud) -> list[dict[str, Any]]:
    nodes = (await bus.ask("list_nodes", {"include_removed": True}))["nodes"]
    return [n for n in nodes if n["provider"] == "gcp" and n["kind"] == "compute"]


async def wait_node(bus: Cloud, check: Any, within: float = 20) -> dict[str, Any]:
    found: dict[str, Any] = {}

    async def ok() -> bool:
        for n in await cloud_nodes(bus):
            if check(n):
                found.update(n)
                return True
        return False

    await wait_for_async(ok, timeout=within, interval=0.2)
    return found


def agent_registration(bus: Cloud, name: str, region: str = "us-central1") -> RegisterNode:
    return RegisterNode(
        minion_id=name,
        name=name,
        region=region,
        owner=bus.account,
        hostname=name,
        gpus=[
            GpuInfo(
                index=0,
                uuid=f"GPU-{name}",
                model="V100",
                nvml_name="Tesla V100-SXM2-16GB",
                memory_mb=16384,
            )
        ],
        simulated=True,
        inventory_source="emulator",
        agent_started_at=datetime.now(UTC),
        heartbeat_s=0.5,
    )


async def heartbeat(bus: Cloud, name: str, running: list[str]) -> None:
    hb = NodeHeartbeat(minion_id=name, at=datetime.now(UTC), running=running)
    await (await bus.agent(name)).nc.publish(subjects.heartbeat(name), hb.to_bytes())


# --- tests -----------------------------------------------------------------------------


async def test_enable_gcp_validates_and_never_shows_the_key(
    nats_server: NatsServer,
    mongo_server: EmbeddedMongo,
    db_prefix: str,
    emulator: EmulatorProcess,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    async with provisioner(nats_server, mongo_server, db_prefix, emulator) as bus:
        bad = await bus.ask(
            "enable_provider",
            {"provider": "gcp", "key_json": json.dumps({"type": "user", "private_key": PEM})},
        )
        assert bad["error"]["code"] == "invalid"
        assert {f["field"] for f in bad["error"]["fields"]} >= {
            "key.type",
            "key.project_id",
            "key.client_email",
        }
        again = await bus.ask("enable_provider", {"provider": "gcp", "key_json": key_json("x")})
        assert again["error"]["code"] == "conflict"
        providers = await bus.ask("list_providers")
        (gcp,) = providers["providers"]
        assert gcp["client_email"] == f"gpufleet@{bus.project}.iam.gserviceaccount.com"
        life = gcp["lifecycle"]
        assert life["writer_identity"].startswith("serviceAccount:")
        state = emulator.admin("state")
        sink = next(s for s in state["sinks"] if s["name"].startswith(f"projects/{bus.project}/"))
        assert 'resource.type="gce_instance"' in sink["filter"]
        assert sink["destination"] == f"pubsub.googleapis.com/{life['topic']}"
        assert life["topic"] in state["topics"] and life["subscription"] in state["subscriptions"]
        # the key is stored encrypted, and never in replies, events or logs
        store = store_for("provisioner", mongo_server.url, db_prefix)
        doc = await store.db.providers.find_one({"provider": "gcp"})
        assert doc is not None and SECRET_MARKER not in json.dumps(doc, default=str)
        assert "key_encrypted" in doc and "key_encrypted" not in gcp
        await asyncio.sleep(0.5)
        for _subject, _headers, data in bus.raw:
            assert SECRET_MARKER not in data.decode() and "PRIVATE KEY" not in data.decode()
        assert any(s.endswith("provider.enabled") for s, _, _ in bus.raw)
        assert "PRIVATE KEY" not in caplog.text and SECRET_MARKER not in caplog.text


async def test_gcp_regions_read_quotas_and_get_a_storage_node(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str, emulator: EmulatorProcess
) -> None:
    async with provisioner(nats_server, mongo_server, db_prefix, emulator) as bus:
        refused = await bus.ask("create_region", {"provider": "gcp", "name": "mars-north1"})
        assert refused["error"]["fields"][0]["rule"] == "R-REG-2"
        emulator.admin(
            "quota",
            {"project": bus.project, "region": "europe-west4", "metric": "CPUS", "limit": 0},
        )
        quotas = await bus.ask("region_quotas", {"name": "europe-west4"})
        assert quotas["runnable_jobs"]["V100"] == 0  # V100 quota 4, but no CPUs (R-REG-3)
        region = await bus.ask("create_region", {"provider": "gcp", "name": "us-central1"})
        # emulator defaults: V100 4, CPUS 96 (/8 = 12), SSD 3000 (/375 = 8)
        assert region["runnable_jobs"]["V100"] == 4 and region["runnable_jobs"]["A100 40GB"] == 2
        again = await bus.ask("create_region", {"provider": "gcp", "name": "us-central1"})
        assert again["error"]["code"] == "conflict"  # one per cloud region
        nodes = (await bus.ask("list_nodes"))["nodes"]
        storage = [n for n in nodes if n["kind"] == "storage"]
        assert [(n["region"], n["state"]) for n in storage] == [("us-central1", "active")]


async def test_burst_run_idle_delete_all_through_the_audit_log(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str, emulator: EmulatorProcess
) -> None:
    async with provisioner(nats_server, mongo_server, db_prefix, emulator) as bus:
        await bus.ask("create_region", {"provider": "gcp", "name": "us-central1"})
        await pending(bus, demand(bus, "job-a"), demand(bus, "job-b", burst_allowed=False))
        node = await wait_node(bus, lambda n: n["cloud"]["state"] == "running")
        name = node["minion_id"]
        assert node["cloud"]["demand"] == "job-a/0" and node["state"] == "provisioning"
        (inst,) = [i for i in emulator.admin("state")["instances"] if i["name"] == name]
        assert inst["scheduling"]["onHostMaintenance"] == "TERMINATE"
        assert inst["guestAccelerators"][0]["acceleratorType"].endswith("nvidia-tesla-v100")
        assert inst["labels"]["gpufleet-account"] == bus.account
        # the same demand again: no second instance
        await pending(bus, demand(bus, "job-a"))
        await asyncio.sleep(0.6)
        assert len(await cloud_nodes(bus)) == 1

        await bus.send(agent_registration(bus, name))  # the instance's agent
        await wait_node(bus, lambda n: n["state"] == "active")
        await heartbeat(bus, name, ["job-a/0"])
        await asyncio.sleep(1.5)  # busy: not deleted however long
        await heartbeat(bus, name, ["job-a/0"])
        assert (await wait_node(bus, lambda n: n["minion_id"] == name))["state"] == "active"
        await heartbeat(bus, name, [])  # idle from now; policy idle_s = 1
        gone = await wait_node(bus, lambda n: n["state"] == "removed")
        assert gone["cloud"]["state"] == "deleted"
        assert name not in [i["name"] for i in emulator.admin("state")["instances"]]

        shown = await bus.ask("show_node", {"node": name})
        steps = [(h["action"], h["phase"]) for h in shown["cloud"]["history"]]
        assert steps == [
            ("insert", "first"),
            ("insert", "last"),
            ("delete", "first"),
            ("delete", "last"),
        ]
        # every step came over NATS from the bridge, keyed by its Pub/Sub message id
        bridged = [
            (h, json.loads(d))
            for s, h, d in bus.raw
            if s == subjects.event("node", "cloud_instance") and json.loads(d)["instance"] == name
        ]
        assert len(bridged) == 4
        for headers, body in bridged:
            assert headers["Nats-Msg-Id"] == f"gcp:{bus.project}:{body['pubsub_message_id']}"
        states = [e["state"] for e in bus.events if e.get("minion_id") == name and "workers" in e]
        assert states == ["maintenance", "removed"]


async def test_quota_exhausted_and_insert_failure(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str, emulator: EmulatorProcess
) -> None:
    async with provisioner(nats_server, mongo_server, db_prefix, emulator) as bus:
        await bus.ask("create_region", {"provider": "gcp", "name": "us-central1"})
        emulator.admin("faults", {"quota_exhausted": True})
        try:
            await pending(bus, demand(bus, "job-q"))
            refused = await wait_node(bus, lambda n: n["cloud"].get("error"))
            assert "quota_exceeded" in refused["cloud"]["error"] and refused["state"] == "removed"
        finally:
            emulator.admin("faults", {"quota_exhausted": False})
    async with provisioner(nats_server, mongo_server, db_prefix + "b", emulator) as bus:
        await bus.ask("create_region", {"provider": "gcp", "name": "us-east1"})
        emulator.admin("faults", {"insert_failures": 1})
        await pending(bus, demand(bus, "job-f"))
        failed = await wait_node(bus, lambda n: n["state"] == "removed")
        assert "does not have enough resources" in failed["cloud"]["error"]
        # the next pass asks again (a new instance for the still-waiting worker)
        await pending(bus, demand(bus, "job-f"), demand(bus, "job-g"))
        await wait_node(bus, lambda n: n["cloud"]["state"] == "running")


async def test_preemption_mid_job_loses_the_node_and_requeues(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str, emulator: EmulatorProcess
) -> None:
    async with provisioner(nats_server, mongo_server, db_prefix, emulator, idle_s=60) as bus:
        await bus.ask("create_region", {"provider": "gcp", "name": "us-west1"})
        await pending(bus, demand(bus, "job-p"))
        node = await wait_node(bus, lambda n: n["cloud"]["state"] == "running")
        name = node["minion_id"]
        await bus.send(agent_registration(bus, name, "us-west1"))
        await wait_node(bus, lambda n: n["state"] == "active")
        await heartbeat(bus, name, ["job-p/0"])
        emulator.admin(
            "preempt", {"project": bus.project, "zone": node["cloud"]["zone"], "instance": name}
        )
        await wait_node(bus, lambda n: n["minion_id"] == name and n["state"] == "removed")
        lost = next(
            e for e in bus.events if e.get("minion_id") == name and e.get("state") == "lost"
        )
        assert lost["workers"] == "requeue" and "preempted" in lost["reason"]


async def test_duplicated_and_out_of_order_entries_apply_once(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str, emulator: EmulatorProcess
) -> None:
    emulator.admin(
        "faults",
        {"duplicate_log_entries": True, "duplicate_deliveries": True, "reorder_log_entries": True},
    )
    try:
        async with provisioner(nats_server, mongo_server, db_prefix, emulator) as bus:
            await bus.ask("create_region", {"provider": "gcp", "name": "asia-east1"})
            await pending(bus, demand(bus, "job-d"))
            node = await wait_node(bus, lambda n: n["cloud"]["state"] == "running")
            await asyncio.sleep(1.0)
            shown = await bus.ask("show_node", {"node": node["minion_id"]})
            history = shown["cloud"]["history"]
            applied = [(h["action"], h["phase"]) for h in history if h["applied"]]
            assert applied == [("insert", "last")]  # last came first; first is stale after it
            assert len(history) >= 4  # each entry published twice (new message ids)
            assert shown["cloud"]["state"] == "running"
            # redeliveries of one Pub/Sub message were stored once in JetStream
            ids = [h["nats_msg_id"] for h in history]
            assert len(ids) == len(set(ids))
    finally:
        emulator.admin(
            "faults",
            {
                "duplicate_log_entries": False,
                "duplicate_deliveries": False,
                "reorder_log_entries": False,
            },
        )
