"""Regional datastores on the real servers (NATS with its permissions, MongoDB), the datastore
service asking the provisioner for the region's facts and device-fleet for its devices: a
`team` plan and a region with a compute node or a device (R-TEN-3, R-RES-1), unique names
in a region, the SMB password sealed and never in a reply or an event, and another account's
datastore "not found"."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from gpufleet_auth.sealing import SealingKey
from gpufleet_bus import Ports
from gpufleet_contracts import subjects
from gpufleet_contracts.datastores import (
    AddDatastore,
    GetDatastore,
    ListDatastores,
    MountDatastore,
    RemoveDatastore,
)
from gpufleet_datastore.app import build_app
from gpufleet_device_fleet.app import build_app as build_device_fleet
from gpufleet_devstack import EmbeddedMongo, NatsServer, wait_for_async
from pymongo import AsyncMongoClient

from ..conftest import as_user, broker_for, connect, running, store_for
from ..provisioner.test_nodes import Bus, provisioner

SECRET = "s3cret-Pa55word"
SMB: dict[str, Any] = {
    "region": "lab-1",
    "name": "nas",
    "type": "smb",
    "address": "10.1.2.3",
    "root_path": "/share/dir2",
    "mount_options": ["vers=3.0", "ro"],
    "username": "alice",
    "password": SECRET,
}


@pytest.fixture
async def services(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str
) -> AsyncIterator[Bus]:
    app = build_app(
        Ports(
            broker_for("datastore", nats_server),
            store_for("datastore", mongo_server.url, db_prefix),
        )
    ).app
    devices = build_device_fleet(
        Ports(
            broker_for("device-fleet", nats_server),
            store_for("device-fleet", mongo_server.url, db_prefix),
        )
    ).app
    async with (
        provisioner(nats_server, mongo_server, db_prefix) as bus,
        running(app),
        running(devices),
    ):
        yield bus


async def admin(bus: Bus, verb: str, body: dict[str, Any]) -> dict[str, Any]:
    reply = await bus.nc.request(
        subjects.admin("provisioner", verb), json.dumps(body).encode(), timeout=10
    )
    data: dict[str, Any] = json.loads(reply.data)
    return data


async def test_datastores_need_a_team_plan_and_a_region_with_a_compute_node(
    services: Bus, nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    bus = services
    events: list[dict[str, Any]] = []

    async def seen(msg: Any) -> None:
        events.append({"subject": msg.subject, "data": msg.data.decode()})

    await bus.nc.subscribe(subjects.event("datastore", "*"), cb=seen)
    async with as_user(nats_server, bus.account, "u") as me:

        async def add(body: dict[str, Any]) -> dict[str, Any]:
            return await me.call(AddDatastore.SUBJECT, json.dumps(body).encode())

        await bus.ask("enable_provider", {"provider": "physical"})
        assert "name" in await bus.ask("create_region", {"name": "lab-1"})
        # no such region of this account
        missing = await add({**SMB, "region": "elsewhere"})
        assert missing["error"]["code"] == "not_found", missing
        # the free plan (R-TEN-3)
        free = await add(SMB)
        assert free["error"]["fields"][0]["rule"] == "R-TEN-3", free
        assert (await admin(bus, "create_account", {"account": bus.account, "plan": "team"}))[
            "plan"
        ] == "team"
        # no compute node yet (R-RES-1)
        empty = await add(SMB)
        assert empty["error"]["fields"][0]["rule"] == "R-RES-1", empty
        node = {"region": "lab-1", "name": "box", "minion_id": f"m{uuid.uuid4().hex[:8]}"}
        assert "state" in await bus.ask("add_node", node)

        added = await add(SMB)
        assert added["region_id"] == f"{bus.account}/lab-1", added
        assert added["password_set"] is True and "password" not in added
        assert SECRET not in json.dumps(added)
        again = await add(SMB)
        assert again["error"]["code"] == "conflict", again
        # the same name in another region is another datastore; a bad option is refused
        bad = await add({**SMB, "name": "x", "mount_options": ["credentials=/etc/shadow"]})
        assert bad["error"]["fields"][0]["field"] == "mount_options", bad
        nfs_pw = await add({**SMB, "name": "y", "type": "nfs", "mount_options": []})
        assert nfs_pw["error"]["fields"][0]["field"] == "username", nfs_pw

        listed = await me.call(ListDatastores.SUBJECT, b"{}")
        assert [d["name"] for d in listed["datastores"]] == ["nas"]
        shown = await me.call(GetDatastore.SUBJECT, b'{"region": "lab-1", "name": "nas"}')
        assert shown["address"] == "10.1.2.3" and SECRET not in json.dumps(shown)

    # at rest: sealed (a Fernet token), never the password itself
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_server.url)
    try:
        stored = await client[f"{db_prefix}_datastore"]["datastores"].find_one({"name": "nas"})
    finally:
        await client.close()
    assert stored is not None and stored["password_sealed"].startswith("gAAAA")
    assert SECRET not in json.dumps(stored, default=str)

    # another account: "not found", for reads and removal alike (R-TEN-2)
    other = f"other{uuid.uuid4().hex[:6]}"
    async with as_user(nats_server, other) as them:
        body = b'{"region": "lab-1", "name": "nas"}'
        for subject in (GetDatastore.SUBJECT, RemoveDatastore.SUBJECT):
            theirs = await them.call(subject, body)
            assert theirs["error"]["code"] == "not_found", theirs
        assert (await them.call(ListDatastores.SUBJECT, b"{}"))["datastores"] == []

    async with as_user(nats_server, bus.account, "u") as me:
        gone = await me.call(RemoveDatastore.SUBJECT, b'{"region": "lab-1", "name": "nas"}')
        assert gone["name"] == "nas"
        assert (await me.call(ListDatastores.SUBJECT, b"{}"))["datastores"] == []

    await wait_for_async(lambda: len(events) >= 2, timeout=10)
    assert [e["subject"].rsplit(".", 1)[-1] for e in events] == ["added", "removed"]
    assert all(SECRET not in e["data"] for e in events)


async def test_a_region_whose_only_machine_is_a_device_takes_a_datastore(
    services: Bus, nats_server: NatsServer
) -> None:
    """R-RES-1 counts devices (device-fleet's), not only the provisioner's compute nodes."""
    bus = services
    await admin(bus, "create_account", {"account": bus.account, "plan": "team"})
    await bus.ask("enable_provider", {"provider": "physical"})
    await bus.ask("create_region", {"name": "lab-1", "storage_mode": "central"})
    storage = f"st{uuid.uuid4().hex[:8]}"
    node = {"region": "lab-1", "name": "st", "minion_id": storage, "kind": "storage"}
    assert (await bus.ask("add_node", node))["state"] == "active"
    async with as_user(nats_server, bus.account, "u") as me:
        add_smb = json.dumps(SMB).encode()
        empty = await me.call(AddDatastore.SUBJECT, add_smb)  # a storage node runs no job
        assert empty["error"]["fields"][0]["rule"] == "R-RES-1", empty
        device = {"region": "lab-1", "name": "cam", "minion_id": f"j{uuid.uuid4().hex[:8]}"}
        added = await me.call(
            subjects.rpc("device-fleet", "add_device"),
            json.dumps({**device, "model": "jetson-orin-nano"}).encode(),
        )
        assert added["state"] == "provisioning", added
        taken = await me.call(AddDatastore.SUBJECT, add_smb)
        assert taken["region_id"] == f"{bus.account}/lab-1", taken
        gone = await me.call(subjects.rpc("device-fleet", "remove_device"), b'{"device": "cam"}')
        assert gone["state"] == "removed", gone
        again = await me.call(AddDatastore.SUBJECT, json.dumps({**SMB, "name": "n2"}).encode())
        assert again["error"]["fields"][0]["rule"] == "R-RES-1", again


async def mount_as(nats_server: NatsServer, minion: str, account: str, name: str) -> Any:
    """MountDatastore as the node `minion` of `account` (its own credential and subject)."""
    nc = await connect(nats_server, nats_server.creds("node", minion, account=account))
    try:
        reply = await nc.request(
            subjects.as_node(MountDatastore.SUBJECT, minion),
            json.dumps({"name": name}).encode(),
            timeout=10,
        )
    finally:
        await nc.close()
    return json.loads(reply.data)


async def test_a_node_of_the_region_gets_the_password_sealed_to_it_and_no_other_node_does(
    services: Bus, nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    bus = services
    await admin(bus, "create_account", {"account": bus.account, "plan": "team"})
    await bus.ask("enable_provider", {"provider": "physical"})
    for region in ("lab-1", "lab-2"):
        await bus.ask("create_region", {"name": region})
    here, there = f"m{uuid.uuid4().hex[:8]}", f"m{uuid.uuid4().hex[:8]}"
    await bus.ask("add_node", {"region": "lab-1", "name": "here", "minion_id": here})
    await bus.ask("add_node", {"region": "lab-2", "name": "there", "minion_id": there})
    # the node's sealing key, as its registration keeps it (vouched for by its nkey)
    key = SealingKey.generate()
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_server.url)
    try:
        await client[f"{db_prefix}_provisioner"]["nodes"].update_one(
            {"minion_id": here}, {"$set": {"sealing_key": key.public_key}}
        )
    finally:
        await client.close()
    async with as_user(nats_server, bus.account, "u") as me:
        added = await me.call(AddDatastore.SUBJECT, json.dumps(SMB).encode())
        assert added["password_set"], added

    got = await mount_as(nats_server, here, bus.account, "nas")
    assert got["address"] == "10.1.2.3" and got["root_path"] == "/share/dir2", got
    assert SECRET not in json.dumps(got)
    assert key.open(got["password"]["box"], got["password"]["key_id"]).decode() == SECRET
    # a node of another region of the same owner, and another account's node (a minion id
    # is the provisioner's once: no other account's credential carries this node's)
    for minion, account in ((there, bus.account), ("evil", "mallory")):
        refused = await mount_as(nats_server, minion, account, "nas")
        assert "error" in refused, (minion, account, sorted(refused))
        assert refused["error"]["code"] == "not_found", (minion, account, refused)
