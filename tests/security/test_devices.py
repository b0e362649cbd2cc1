"""Attack class: edge devices (R-DEV-1..3). A device's credential, made by the victim's own
join token, may state only its own device's status and heartbeat: another device's subject
(or a compute node's heartbeat subject) is refused by the server, and a heartbeat naming
another device on its own subject refreshes only its own. A node credential cannot state a
device's status or heartbeat at all. The attacker's account
finds none of the victim's devices or configurations ("not found", as unknown ones)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpufleet_contracts import subjects
from gpufleet_contracts.devices import DeployState, DeviceHeartbeat, DeviceStatusReported
from gpufleet_devstack import wait_for_async
from gpufleet_node_agent.enrol import enrol

from .attack import Client
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
