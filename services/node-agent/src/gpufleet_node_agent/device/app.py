"""Composition root of the device agent: its ports (a broker, no store) in, its Service out;
every subject it handles is in the one wiring table below."""

from __future__ import annotations

from typing import cast

from gpufleet_bus import Events, Every, Ports, Service, ServiceRuntime, publish
from gpufleet_bus.publish import Publisher
from gpufleet_bus.streams import node_consumer_config
from gpufleet_contracts import subjects
from gpufleet_contracts.devices import ApplyDeviceConfig, DeviceStatusReported

from .keeper import DeviceKeeper
from .settings import DeviceSettings

SERVICE = "device-agent"
SOURCE = "gpufleet/device-agent"


def build_device_app(ports: Ports, settings: DeviceSettings) -> Service[DeviceKeeper]:
    publisher = cast(Publisher, ports.broker)

    async def report(msg: DeviceStatusReported) -> None:
        await publish(publisher, msg, source=SOURCE)

    keeper = DeviceKeeper(settings, report, ports.clock)
    mid = settings.minion_id
    rt = ServiceRuntime(SERVICE, ports, infrastructure=False)
    rt.wire(
        # requests to this device alone (its health), from services and operators
        direct={subjects.node_health(mid): keeper.health},
        events={
            # its own command consumer, made by the provisioner at enrolment (read-only)
            "commands": Events(
                {ApplyDeviceConfig: keeper.apply},
                subject=subjects.command("node", "*", key=mid),
                consumer=node_consumer_config(mid),
            ),
        },
        every=[Every(settings.device_watch_s, keeper.watch, "device-watch", at_start=False)],
        publishes=[DeviceStatusReported],
        startup=[keeper.start],
        shutdown=[keeper.stop],
    )
    return rt.built(keeper)
