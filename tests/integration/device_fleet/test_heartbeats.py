"""Devices' heartbeats on the real servers: a device heard on its own heartbeat subject is
`online` with its last heartbeat's time and telemetry; one never heard is `offline`; a
heartbeat whose body names another device refreshes neither (the device is the subject's,
and the server lets a device's credential publish only its own)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

from gpufleet_contracts.devices import DeviceHeartbeat, DeviceTelemetry
from gpufleet_contracts.nodes import GpuSample
from gpufleet_devstack import EmbeddedMongo, NatsServer

from .test_devices import fleet, minion


async def test_a_device_heard_is_online_with_its_telemetry_and_speaks_only_for_itself(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str, tmp_path: Path
) -> None:
    async with fleet(nats_server, mongo_server, db_prefix) as f:
        await f.central("edge")
        a, b = minion(), minion()
        for name, m in (("a", a), ("b", b)):
            await f.ask(
                "add_device",
                {"region": "edge", "name": name, "minion_id": m, "model": "jetson-orin-nx"},
            )
        device_a = await f.enrolled(a, tmp_path)
        shown = await f.device("a")
        assert (shown["presence"], shown["last_seen"], shown["telemetry"]) == (
            "offline",
            None,
            None,
        )

        # a body naming b on a's own subject: nothing for either device
        forged = DeviceHeartbeat(minion_id=b, at=datetime.now(UTC), period_s=5.0)
        on_a = DeviceHeartbeat.SUBJECT.format(minion_id=a)
        await device_a.publish(on_a, forged.to_bytes())
        await asyncio.sleep(1.0)  # five store rounds
        for name in ("a", "b"):
            assert (await f.device(name))["presence"] == "offline"

        telemetry = DeviceTelemetry(
            cpu_pct=12.5,
            ram_used_mb=2048,
            ram_total_mb=16384,
            disk_used_pct=40.0,
            disk_free_gb=20.5,
            gpu=GpuSample(index=0, utilization_pct=85, temperature_c=61, power_w=25.0),
        )
        hb = DeviceHeartbeat(
            minion_id=a, at=datetime.now(UTC), seq=1, period_s=5.0, telemetry=telemetry
        )
        before = datetime.now(UTC)
        await device_a.publish(hb.subject(), hb.to_bytes())
        shown = await f.until("a", presence="online")
        assert datetime.fromisoformat(shown["last_seen"]) >= before.replace(microsecond=0)
        assert DeviceTelemetry.model_validate(shown["telemetry"]) == telemetry
        assert shown["state"] == "provisioning"  # liveness only: its first report activates it
        listed = {d["name"]: d for d in (await f.ask("list_devices"))["devices"]}
        assert (listed["a"]["presence"], listed["b"]["presence"]) == ("online", "offline")
