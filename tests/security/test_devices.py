"""Attack class: edge devices (R-DEV-1..3). A device's credential, made by the victim's own
join token, may state only its own device's status and heartbeat: another device's subject
(or a compute node's heartbeat subject) is refused by the server, and a heartbeat naming
another device on its own subject refreshes only its own. A node credential cannot state a
device's status or heartbeat at all. The attacker's account
finds none of the victim's devices or configurations ("not found", as unknown ones). A
removed device's credential is revoked: closed at once, refused from then on. A
configuration's attached keys reach only the device that runs it, sealed to a key of its own."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpufleet_auth import Creds
from gpufleet_auth.sealing import SealingKey
from gpufleet_contracts import subjects
from gpufleet_contracts.devices import (
    DeployState,
    DeviceHeartbeat,
    DeviceKeys,
    DeviceStatusReported,
    GetDeviceKeys,
)
from gpufleet_devstack import wait_for_async
from gpufleet_node_agent.enrol import enrol

from .attack import Client, connect_refused
from .conftest import ATTACKER_ACCOUNT, VICTIM_ACCOUNT, System, Victim


def attacker_subject(verb: str) -> str:
    return subjects.as_account(subjects.rpc("device-fleet", verb), ATTACKER_ACCOUNT)


async def ask(c: Client, service: str, verb: str, body: dict[str, Any]) -> dict[str, Any]:
    """The victim's own request (what its CLI sends)."""
    return await c.request(subjects.as_account(subjects.rpc(service, verb), VICTIM_ACCOUNT), body)


def status(minion: str) -> DeviceStatusReported:
    return DeviceStatusReported(
        minion_id=minion, state=DeployState.running, inference="running", at=datetime.now(UTC)
    )


def heartbeat(minion: str) -> DeviceHeartbeat:
    return DeviceHeartbeat(minion_id=minion, at=datetime.now(UTC), period_s=5.0)


async def test_a_device_states_only_its_own_status_and_other_accounts_see_nothing(
    system: System, victim: Victim, victim_user: Path, eve: Path, evil_node: Path, tmp_path: Path
) -> None:
    region = f"edge-{uuid.uuid4().hex[:6]}"
    a, b = f"dev-{uuid.uuid4().hex[:8]}", f"dev-{uuid.uuid4().hex[:8]}"
    async with Client(system.nats.url, victim_user, name="victim") as me:
        await ask(me, "provisioner", "enable_provider", {"provider": "physical"})  # or conflict
        made = await ask(
            me, "provisioner", "create_region", {"name": region, "storage_mode": "central"}
        )
        assert made["storage_mode"] == "central", made
        storage = f"st-{uuid.uuid4().hex[:8]}"
        node = {"region": region, "name": storage, "minion_id": storage, "kind": "storage"}
        assert (await ask(me, "provisioner", "add_node", node))["state"] == "active"
        for m in (a, b):
            device = {"region": region, "name": m, "minion_id": m, "model": "jetson-orin-nx"}
            assert (await ask(me, "device-fleet", "add_device", device))["state"] == "provisioning"
        cfg = {"region": region, "name": "cfg", "image": "i", "model": "m", "start_command": "r"}
        assert (await ask(me, "device-fleet", "add_config", cfg))["name"] == "cfg"
        token = (await ask(me, "device-fleet", "issue_token", {"device": a}))["token"]
        creds = tmp_path / "a.creds"
        await enrol([system.nats.url], token, a, creds, attempts=3)

        # device a on device b's subject, and a node on a device's: refused by the server
        async with Client(system.nats.url, creds, name="device-a") as device_a:
            await device_a.js_send_refused(status(b).subject(), status(b))
            await device_a.send_refused(heartbeat(b).subject(), heartbeat(b))
            await device_a.send_refused(subjects.heartbeat(a), heartbeat(a))  # a node's
        async with Client(system.nats.url, evil_node, name="evil-node") as node_agent:
            await node_agent.js_send_refused(status(a).subject(), status(a))
            await node_agent.send_refused(heartbeat(a).subject(), heartbeat(a))
        await asyncio.sleep(1.0)
        for m in (a, b):
            shown = await ask(me, "device-fleet", "show_device", {"device": m})
            assert (shown["state"], shown["inference"]) == ("provisioning", None), shown
            assert (shown["presence"], shown["last_seen"]) == ("offline", None), shown

        # b's heartbeat on a's own subject counts for a alone, once stored
        async with Client(system.nats.url, creds, name="device-a") as device_a:
            await device_a.send(heartbeat(a).subject(), heartbeat(b))
            await device_a.send(heartbeat(a).subject(), heartbeat(a))

        async def a_online() -> bool:
            shown = await ask(me, "device-fleet", "show_device", {"device": a})
            return bool(shown["presence"] == "online")

        await wait_for_async(a_online, timeout=15)
        shown = await ask(me, "device-fleet", "show_device", {"device": b})
        assert (shown["presence"], shown["last_seen"]) == ("offline", None), shown

        # the attacker's account: the victim's device, configuration and region are unknown
        async with Client(system.nats.url, eve) as attacker:
            for verb, body in (
                ("show_device", {"device": a}),
                ("remove_device", {"device": a}),
                ("issue_token", {"device": b}),
                ("set_config", {"device": a, "config": None}),
                ("show_config", {"region": region, "name": "cfg"}),
                ("remove_config", {"region": region, "name": "cfg"}),
                ("deploy", {"devices": [a]}),
            ):
                reply = await attacker.request(attacker_subject(verb), body)
                assert reply.get("ok") is False, (verb, reply)
                assert reply["error"]["code"] == "not_found", (verb, reply)
            assert (await attacker.request(attacker_subject("list_devices"), {}))["devices"] == []
            theirs = {"region": region, "name": "x", "minion_id": "m-x", "model": "jetson-orin-nx"}
            added = await attacker.request(attacker_subject("add_device"), theirs)
            assert added["error"]["code"] == "not_found", added  # not its region
        assert (await ask(me, "device-fleet", "show_device", {"device": a}))["state"] == (
            "provisioning"
        )
    await victim.assert_untouched()


async def test_a_removed_devices_credential_connects_and_publishes_no_more(
    system: System, victim_user: Path, tmp_path: Path
) -> None:
    """A device removed by its owner (a stolen Jetson, a returned one): the credential its
    join token gave is revoked (the provisioner takes device-fleet's `DeviceRemoved`), so its
    open connection is closed and the credential is refused from then on."""
    region = f"edge-{uuid.uuid4().hex[:6]}"
    m = f"dev-{uuid.uuid4().hex[:8]}"
    async with Client(system.nats.url, victim_user, name="victim") as me:
        await ask(me, "provisioner", "enable_provider", {"provider": "physical"})  # or conflict
        await ask(me, "provisioner", "create_region", {"name": region, "storage_mode": "central"})
        storage = f"st-{uuid.uuid4().hex[:8]}"
        node = {"region": region, "name": storage, "minion_id": storage, "kind": "storage"}
        assert (await ask(me, "provisioner", "add_node", node))["state"] == "active"
        device = {"region": region, "name": m, "minion_id": m, "model": "jetson-orin-nx"}
        assert (await ask(me, "device-fleet", "add_device", device))["state"] == "provisioning"
        token = (await ask(me, "device-fleet", "issue_token", {"device": m}))["token"]
        creds = tmp_path / "device.creds"
        await enrol([system.nats.url], token, m, creds, attempts=3)

        async with Client(system.nats.url, creds, name="device") as stolen:
            assert (await stolen.js_send(status(m).subject(), status(m))).seq > 0  # it may now
            removed = await ask(me, "device-fleet", "remove_device", {"device": m})
            assert removed["state"] == "removed", removed
            await asyncio.wait_for(stolen.disconnected.wait(), timeout=15)
    await connect_refused(system.nats.url, Creds.read(creds))


async def test_a_device_s_attached_keys_reach_only_it_sealed(
    system: System, victim: Victim, victim_user: Path, eve: Path, evil_node: Path, tmp_path: Path
) -> None:
    """R-DEV-2: a configuration's attached keys are asked on the device's own subject and
    answered sealed to the key it sent. Another device's credential, a node's or another
    account's user cannot ask on that subject; another device asking on its own subject for
    the keys of a configuration it does not run gets "not found"."""
    region = f"keys-{uuid.uuid4().hex[:6]}"
    a, b = f"dev-{uuid.uuid4().hex[:8]}", f"dev-{uuid.uuid4().hex[:8]}"
    secret = f"hf-{uuid.uuid4().hex}"
    async with Client(system.nats.url, victim_user, name="victim") as me:
        await ask(me, "provisioner", "enable_provider", {"provider": "physical"})  # or conflict
        made = await ask(
            me, "provisioner", "create_region", {"name": region, "storage_mode": "central"}
        )
        assert made["storage_mode"] == "central", made
        storage = f"st-{uuid.uuid4().hex[:8]}"
        node = {"region": region, "name": storage, "minion_id": storage, "kind": "storage"}
        assert (await ask(me, "provisioner", "add_node", node))["state"] == "active"
        key = {"type": "huggingface", "secret": {"token": secret}}
        assert (await ask(me, "scheduler", "attach_key", key))["fields"] == ["token"]
        base = {"region": region, "model": "m", "start_command": "r"}
        keyed = {**base, "name": "keyed", "image": "cam:1", "keys": ["huggingface"]}
        assert (await ask(me, "device-fleet", "add_config", keyed))["keys"] == ["huggingface"]
        plain = {**base, "name": "plain", "image": "p"}
        assert (await ask(me, "device-fleet", "add_config", plain))["name"] == "plain"
        creds: dict[str, Path] = {}
        for m, cfg in ((a, "keyed"), (b, "plain")):
            device = {"region": region, "name": m, "minion_id": m, "model": "jetson-orin-nx"}
            assert (await ask(me, "device-fleet", "add_device", device))["name"] == m
            await ask(me, "device-fleet", "set_config", {"device": m, "config": cfg})
            token = (await ask(me, "device-fleet", "issue_token", {"device": m}))["token"]
            creds[m] = tmp_path / f"{m}.creds"
            await enrol([system.nats.url], token, m, creds[m], attempts=3)
            assert (await ask(me, "device-fleet", "deploy", {"devices": [m]}))["rollout_id"]

    sealed_to = SealingKey.generate()
    body = GetDeviceKeys(image="cam:1", types=["huggingface"], public_key=sealed_to.public_key)
    asked = body.model_dump(mode="json")
    on_a = subjects.as_node(GetDeviceKeys.SUBJECT, a)
    async with Client(system.nats.url, creds[a], name="device-a") as device_a:
        reply = await device_a.request(on_a, asked)
    assert secret not in json.dumps(reply)  # sealed: the value is in no reply
    box = DeviceKeys.model_validate(reply).sealed
    assert secret in sealed_to.open(box.box, box.key_id).decode()

    async with Client(system.nats.url, creds[b], name="device-b") as device_b:
        await device_b.request_refused(on_a, asked)  # a's subject: refused by the server
        theirs = await device_b.request(subjects.as_node(GetDeviceKeys.SUBJECT, b), asked)
        assert theirs["error"]["code"] == "not_found", theirs  # not a configuration b runs
    for who, cred in (("eve", eve), ("evil-node", evil_node)):
        async with Client(system.nats.url, cred, name=who) as attacker:
            await attacker.request_refused(on_a, asked)
    await victim.assert_untouched()
