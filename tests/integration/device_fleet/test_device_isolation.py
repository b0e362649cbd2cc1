"""Devices and tenancy on the real servers (security): a device's credential speaks only for
its own device (the server refuses another's subject; a body naming another device on its
own subject is ignored), and another account's devices and configurations are "not found",
its same-named region not the owner's."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path

import nats
from gpufleet_bus import publish
from gpufleet_bus.publish import publish_raw
from gpufleet_contracts import subjects
from gpufleet_contracts.devices import DeployState, DeviceStatusReported
from gpufleet_devstack import EmbeddedMongo, NatsServer, wait_for_async

from ..conftest import JsPublisher
from .test_devices import fleet, minion

S = DeployState


async def test_a_device_speaks_only_for_itself_and_other_accounts_see_nothing(
    nats_server: NatsServer,
    mongo_server: EmbeddedMongo,
    db_prefix: str,
    tmp_path: Path,
) -> None:
    async with fleet(nats_server, mongo_server, db_prefix) as f:
        await f.central("edge")
        a, b = minion(), minion()
        for name, m in (("a", a), ("b", b)):
            await f.ask(
                "add_device",
                {"region": "edge", "name": name, "minion_id": m, "model": "jetson-xavier-nx"},
            )
        await f.enrolled(a, tmp_path)
        # the server refuses a's credential on b's subject
        forged = DeviceStatusReported(
            minion_id=b, state=S.running, inference="running", at=datetime.now(UTC)
        )
        errors: list[str] = []

        async def on_error(exc: Exception) -> None:
            errors.append(str(exc).lower())

        forger = await nats.connect(
            nats_server.url, error_cb=on_error, **NatsServer.client(f.creds[a])
        )
        try:
            await forger.publish(forged.subject(), forged.to_bytes())
            await forger.flush()
            wanted = f'permissions violation for publish to "{forged.subject().lower()}"'
            await wait_for_async(lambda: any(wanted in e for e in errors), timeout=5)
        finally:
            await forger.close()
        # a body naming b on a's own subject: the server lets it through, device-fleet
        # ignores it (the device is the subject's); then a's own report counts
        on_own = subjects.EVENTS + f".device.status.{a}"
        await publish_raw(
            JsPublisher(f.devices[a]),
            on_own,
            forged.to_bytes(),
            type_=DeviceStatusReported.TYPE,
            source="test",
            msg_id=uuid.uuid4().hex,
        )
        own = forged.model_copy(update={"minion_id": a, "inference": None})
        await publish(JsPublisher(f.devices[a]), own, source="test")
        await f.until(a, state="active")
        assert (await f.device(b))["state"] == "provisioning"
        assert (await f.device(b)).get("inference") is None

        # another account: not found, for devices and configurations alike
        other = f"acct-{uuid.uuid4().hex[:6]}"
        nc = await nats.connect(
            nats_server.url, **NatsServer.client(nats_server.creds("user", "u", account=other))
        )
        try:
            await f.ask(
                "add_config",
                {"region": "edge", "name": "c", "image": "i", "model": "m", "start_command": "c"},
            )
            for verb, body in (
                ("show_device", {"device": "a"}),
                ("remove_device", {"device": a}),
                ("issue_token", {"device": "a"}),
                ("show_config", {"region": "edge", "name": "c"}),
                ("remove_config", {"region": "edge", "name": "c"}),
            ):
                got = await f.ask(verb, body, user=nc, account=other)
                assert got["error"]["code"] == "not_found", (verb, got)
            assert (await f.ask("list_devices", {}, user=nc, account=other))["devices"] == []
            # its region of the same name is not this account's
            refused = await f.ask(
                "add_device",
                {"region": "edge", "name": "z", "minion_id": minion(), "model": "jetson-orin-nx"},
                user=nc,
                account=other,
            )
            assert refused["error"]["code"] == "not_found"
        finally:
            await nc.close()
        assert (await f.device("a"))["state"] == "active"
