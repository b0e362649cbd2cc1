"""A device's credential and an account's removal, with device-fleet and the provisioner on
the real servers: removing a device (`remove_device`) revokes the enrolment its join token
gave (the provisioner takes its `DeviceRemoved`: its connection closes and its credential
connects no more), and a late copy of that event leaves a newer device of the same minion
id alone; the provisioner's `AccountRemoved` removes each of the account's devices as
`remove_device` does (a `DeviceRemoved` each, for billing's fee, R-BILL-3; their enrolments
revoked in turn) and cancels its open rollouts, and delivered again changes nothing."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats
import nats.errors
import pytest
from gpufleet_contracts import Message, subjects
from gpufleet_contracts.base import envelope_for
from gpufleet_contracts.devices import DeviceRemoved
from gpufleet_contracts.identity import AccountRemoved
from gpufleet_devstack import EmbeddedMongo, NatsServer, wait_for_async
from nats.aio.client import Client

from ..conftest import admin_connect
from .test_devices import Fleet, S, fleet, minion

EVENTS = subjects.STREAM_EVENTS


async def deliver(nc: Client, msg: Message) -> int:
    """`msg` on JetStream as a service publishes it (a fresh message id each time: what a
    redelivery hands the consumer again); its stream sequence."""
    env = envelope_for(msg, source="test", id=uuid.uuid4().hex)
    ack = await nc.jetstream().publish(msg.subject(), msg.to_bytes(), headers=env.headers())
    return int(ack.seq)


async def handled(nc: Client, durable: str, seq: int) -> None:
    """The consumer `durable` of the events stream has acked sequence `seq`."""

    async def acked() -> bool:
        info = await nc.jetstream().consumer_info(EVENTS, durable)
        return int(info.ack_floor.stream_seq or 0) >= seq

    await wait_for_async(acked, timeout=20, interval=0.1, message=f"{durable} never acked {seq}")


async def cut_off(f: Fleet, m: str) -> None:
    """Device `m`'s connection was closed by the server, and its credential connects no more."""
    await wait_for_async(lambda: not f.devices[m].is_connected, timeout=10)
    with pytest.raises((nats.errors.Error, OSError)):
        nc = await nats.connect(
            f.bus.server.url, allow_reconnect=False, **NatsServer.client(f.creds[m])
        )
        await nc.flush(timeout=2)
        await nc.close()


def removed_events(f: Fleet) -> list[dict[str, Any]]:
    return [e for e in f.events if e["subject"] == DeviceRemoved.SUBJECT]


async def _removals(f: Fleet) -> list[tuple[str, str, str | None]]:
    listed = await f.ask("list_devices", {"include_removed": True})
    return [(d["device_id"], d["state"], d["removed_at"]) for d in listed["devices"]]


async def added(f: Fleet, region: str, name: str, m: str) -> None:
    body = {"region": region, "name": name, "minion_id": m, "model": "jetson-orin-nx"}
    assert (await f.ask("add_device", body))["state"] == "provisioning"


async def test_a_removed_devices_credential_is_revoked_and_a_newer_one_kept(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str, tmp_path: Path
) -> None:
    async with fleet(nats_server, mongo_server, db_prefix) as f:
        await f.central("edge")
        gone, kept = minion(), minion()
        for name, m in (("gone", gone), ("kept", kept)):
            await added(f, "edge", name, m)
            await f.enrolled(m, tmp_path / name)
            await f.report(m, S.idle)
        await f.until("kept", state="active")

        removed = await f.ask("remove_device", {"device": "gone"})
        assert removed["state"] == "removed"
        await cut_off(f, gone)
        [event] = removed_events(f)
        assert (event["minion_id"], event["account"]) == (gone, f.bus.account)
        await f.report(kept, S.idle)  # the other device speaks on
        assert f.devices[kept].is_connected

        # the minion id given to a new device, enrolled: the old removal, delivered late,
        # leaves it alone
        await f.devices[gone].close()
        await added(f, "edge", "again", gone)
        await f.enrolled(gone, tmp_path / "again")
        await f.report(gone, S.idle)
        await f.until("again", state="active")
        nc = await admin_connect(nats_server)
        try:
            late = DeviceRemoved.model_validate({k: v for k, v in event.items() if k != "subject"})
            await handled(nc, "provisioner-device-removed", await deliver(nc, late))
        finally:
            await nc.close()
        await asyncio.sleep(0.3)
        assert f.devices[gone].is_connected
        await f.report(gone, S.idle)


async def test_a_removed_accounts_devices_are_removed_once_and_its_rollouts_cancelled(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str, tmp_path: Path
) -> None:
    async with fleet(nats_server, mongo_server, db_prefix) as f:
        await f.central("edge")
        ms = [minion(), minion()]
        for i, m in enumerate(ms):
            await added(f, "edge", f"d{i}", m)
        cfg = {"region": "edge", "name": "cfg", "image": "i", "model": "m", "start_command": "r"}
        assert (await f.ask("add_config", cfg))["name"] == "cfg"
        for i in range(2):
            assert (await f.ask("set_config", {"device": f"d{i}", "config": "cfg"}))["config"]
        await f.enrolled(ms[0], tmp_path)
        await f.report(ms[0], S.idle)
        await f.until("d0", state="active")
        rollout = await f.ask("deploy", {"devices": ["d0", "d1"], "policy": {"canary": 1}})
        rid = rollout["rollout_id"]
        assert rollout["phase"] == "canary", rollout

        nc = await admin_connect(nats_server)
        try:
            at = datetime.now(UTC)
            seq = await deliver(nc, AccountRemoved(account=f.bus.account, at=at))
            await handled(nc, "device-fleet-account-removed", seq)
            listed = await f.ask("list_devices", {"include_removed": True})
            assert {d["state"] for d in listed["devices"]} == {"removed"}, listed
            assert (await f.rollout(rid))["phase"] == "cancelled"
            await wait_for_async(lambda: len(removed_events(f)) == 2, timeout=10)
            assert {e["minion_id"] for e in removed_events(f)} == set(ms)
            assert {datetime.fromisoformat(e["at"]) for e in removed_events(f)} == {at}
            await cut_off(f, ms[0])  # its enrolment revoked in turn (the provisioner)

            # delivered again: nothing removed, cancelled or published
            before = await _removals(f)
            shown = len(f.events)
            seq = await deliver(nc, AccountRemoved(account=f.bus.account, at=datetime.now(UTC)))
            await handled(nc, "device-fleet-account-removed", seq)
            await asyncio.sleep(0.5)  # what it would have published has had time to arrive
            assert f.events[shown:] == []
            assert await _removals(f) == before
        finally:
            await nc.close()
