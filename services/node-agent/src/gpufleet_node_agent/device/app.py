"""Composition root of the device agent: its ports (a broker, no store) in, its Service out;
every subject it handles is in the one wiring table below."""

from __future__ import annotations

from typing import cast

from gpufleet_bus import Events, Every, Ports, Service, ServiceRuntime, publish
from gpufleet_bus.publish import Publisher
from gpufleet_bus.streams import node_consumer_config
from gpufleet_contracts import subjects
from gpufleet_contracts.devices import ApplyDeviceConfig, DeviceHeartbeat, DeviceStatusReported

from ..agent import bus_requester
from ..mounts.keeper import DatastoreMounts
from ..mounts.node import MOUNTS_DIR, asker, make_mounter, opener
from .checkpoints import DeviceCheckpoints
from .heartbeat import Heartbeat
from .keeper import DeviceKeeper
from .keys import DeviceKeyFiles
from .output import DeviceOutput
from .settings import DeviceSettings

SERVICE = "device-agent"
SOURCE = "gpufleet/device-agent"


def build_device_app(ports: Ports, settings: DeviceSettings) -> Service[DeviceKeeper]:
    publisher = cast(Publisher, ports.broker)

    async def report(msg: DeviceStatusReported) -> None:
        await publish(publisher, msg, source=SOURCE)

    async def send(msg: DeviceHeartbeat) -> None:
        await publish(publisher, msg, source=SOURCE)  # core NATS: no stream holds it

    # its configuration's datastore: asked of the datastore service on its own subject; no
    # sealing key yet, so an SMB share's password cannot reach it (README)
    mounts = DatastoreMounts(
        make_mounter(
            settings.datastore_mounter,
            settings.datastore_bind_root,
            settings.datastore_probe_timeout_s,
            settings.device_state_dir / MOUNTS_DIR,
        ),
        settings.device_state_dir / MOUNTS_DIR,
        asker(settings.minion_id, bus_requester(ports.broker)),
        opener(None),
    )
    # its configuration's attached keys: asked of the scheduler on its own subject, sealed
    # to a fresh key of this request's (keys.py)
    keys = DeviceKeyFiles(
        settings.device_state_dir, settings.minion_id, bus_requester(ports.broker)
    )
    # its configuration's checkpoints: a read grant of each asked of the scheduler on its own
    # subject, fetched from the platform store (checkpoints.py)
    checkpoints = DeviceCheckpoints(
        settings.device_state_dir,
        settings.minion_id,
        bus_requester(ports.broker),
        settings.staging_ca_file,
    )
    output = DeviceOutput(settings.device_state_dir, mounts)
    keeper = DeviceKeeper(settings, report, ports.clock, output, keys, checkpoints)
    heartbeat = Heartbeat(settings, send, ports.clock, keeper.running)
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
        every=[
            Every(settings.device_watch_s, keeper.watch, "device-watch", at_start=False),
            Every(settings.heartbeat_s, heartbeat.beat, "device-heartbeat"),
            Every(settings.datastore_probe_s, mounts.heal, "datastore-probe", at_start=False),
        ],
        publishes=[DeviceStatusReported, DeviceHeartbeat],
        startup=[keeper.start],
        shutdown=[keeper.stop],
    )
    return rt.built(keeper)
