"""Composition root of device-fleet: its ports in, its Service out; every subject it handles
is in the one wiring table below.

Edge devices (Jetson) and their inference configurations (R-DEV-1..3): an account's devices
and configurations on its own request subjects; rollouts driven by the devices' own reports
(`evt.device.status.<minion_id>`) and a round for timeouts; their heartbeats
(`hb.device.<minion_id>`) stored once per round; commands to a device through the outbox on
its own command subject; a region's device count (R-RES-1) and who a device is, for the
datastore service.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet_bus import Delivery, Every, Ports, Request, Service, ServiceRuntime
from gpufleet_contracts import subjects
from gpufleet_contracts.datastores import NodeFacts
from gpufleet_contracts.devices import (
    AddDevice,
    AddDeviceConfig,
    ApplyDeviceConfig,
    CancelRollout,
    CountRegionDevices,
    DeployConfig,
    DeviceAdded,
    DeviceConfigList,
    DeviceConfigsTold,
    DeviceConfigView,
    DeviceHeartbeat,
    DeviceList,
    DeviceRemoved,
    DeviceStatusReported,
    DeviceTokenIssued,
    DeviceView,
    GetDeviceConfigsTold,
    GetDeviceFacts,
    IssueDeviceToken,
    ListDeviceConfigs,
    ListDevices,
    ListRollouts,
    RegionDevices,
    RemoveDevice,
    RemoveDeviceConfig,
    RolloutList,
    RolloutView,
    SetDeviceConfig,
    ShowDevice,
    ShowDeviceConfig,
    ShowRollout,
)
from gpufleet_contracts.identity import AccountRemoved
from pydantic_settings import BaseSettings, SettingsConfigDict

from . import configs, deployments, devices
from .accounts import AccountRemoval
from .configs import Configs
from .deployments import Deployments
from .devices import Devices
from .heartbeats import Heartbeats
from .regions import Provisioner

SERVICE = "device-fleet"
INDEXES = {**devices.INDEXES, **configs.INDEXES, **deployments.INDEXES}


class DeviceFleetSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPUFLEET_DEVICE_FLEET_", extra="ignore")
    tick_s: float = 5.0  # how often devices past their rollout's timeout are failed
    heartbeats_s: float = 2.0  # how often the heartbeats heard are stored


@dataclass(frozen=True)
class DeviceFleet:
    """The service's parts (what `build_app` returns as its core)."""

    devices: Devices
    configs: Configs
    deployments: Deployments
    heartbeats: Heartbeats
    accounts: AccountRemoval


class Handlers:
    """Requests act for the account of their subject (R-TEN-2): another account's device,
    configuration or rollout is not found. A device's report counts only on its own subject."""

    def __init__(self, fleet: DeviceFleet) -> None:
        self.devices = fleet.devices
        self.configs = fleet.configs
        self.deployments = fleet.deployments
        self.heartbeats = fleet.heartbeats
        self.accounts = fleet.accounts

    async def add_device(self, body: AddDevice, account: str) -> DeviceView:
        return await self.devices.add(body, account)

    async def list_devices(self, body: ListDevices, account: str) -> DeviceList:
        return await self.devices.list(account, body.region, body.include_removed)

    async def show_device(self, body: ShowDevice, account: str) -> DeviceView:
        return await self.devices.show(account, body.device)

    async def remove_device(self, body: RemoveDevice, account: str) -> DeviceView:
        return await self.devices.remove(account, body.device)

    async def issue_token(self, body: IssueDeviceToken, account: str) -> DeviceTokenIssued:
        return await self.devices.token(account, body.device, body.ttl_s)

    async def set_config(self, body: SetDeviceConfig, account: str) -> DeviceView:
        return await self.configs.set_on(account, body.device, body.config)

    async def add_config(self, body: AddDeviceConfig, account: str) -> DeviceConfigView:
        return await self.configs.add(body, account)

    async def list_configs(self, body: ListDeviceConfigs, account: str) -> DeviceConfigList:
        return await self.configs.list(account, body.region)

    async def show_config(self, body: ShowDeviceConfig, account: str) -> DeviceConfigView:
        return await self.configs.show(account, body.region, body.name)

    async def remove_config(self, body: RemoveDeviceConfig, account: str) -> DeviceConfigView:
        return await self.configs.remove(account, body.region, body.name)

    async def deploy(self, body: DeployConfig, account: str) -> RolloutView:
        return await self.deployments.deploy(body, account)

    async def show_rollout(self, body: ShowRollout, account: str) -> RolloutView:
        return await self.deployments.show(account, body.rollout_id)

    async def list_rollouts(self, body: ListRollouts, account: str) -> RolloutList:
        return await self.deployments.recent(account, body.limit)

    async def cancel_rollout(self, body: CancelRollout, account: str) -> RolloutView:
        return await self.deployments.cancel(account, body.rollout_id)

    async def status_reported(self, body: DeviceStatusReported, delivery: Delivery) -> None:
        """A device's report: its state, inference status and its rollout's next step."""
        await self.deployments.reported(body, delivery.subject, delivery.received_at)

    async def heartbeat(self, body: DeviceHeartbeat, delivery: Delivery) -> None:
        """A device's heartbeat, for the device of its subject: last seen, telemetry."""
        await self.heartbeats.heard(body, delivery)

    async def account_removed(self, body: AccountRemoved) -> None:
        """The provisioner removed an account: its devices are removed and its rollouts
        cancelled (accounts.py)."""
        await self.accounts.removed(body)

    async def region_devices(self, body: CountRegionDevices) -> RegionDevices:
        return await self.devices.count_in(body.region_id)

    async def device_facts(self, body: GetDeviceFacts) -> NodeFacts:
        return await self.devices.facts(body.minion_id)

    async def configs_told(self, body: GetDeviceConfigsTold) -> DeviceConfigsTold:
        return await self.devices.told(body.minion_id)


def build_app(ports: Ports, settings: DeviceFleetSettings | None = None) -> Service[DeviceFleet]:
    settings = settings or DeviceFleetSettings()
    provisioner = Provisioner(ports.broker)
    found = Devices(ports.db, ports.clock, provisioner)
    rollouts = Deployments(ports.db, ports.clock)
    fleet = DeviceFleet(
        devices=found,
        configs=Configs(ports.db, ports.clock, provisioner, found),
        deployments=rollouts,
        heartbeats=Heartbeats(ports.db, ports.clock),
        accounts=AccountRemoval(ports.db, found, rollouts),
    )
    on = Handlers(fleet)
    rt = ServiceRuntime(SERVICE, ports, indexes=INDEXES)
    rt.wire(
        requests={
            "add_device": on.add_device,
            "list_devices": on.list_devices,
            "show_device": on.show_device,
            "remove_device": on.remove_device,
            "issue_token": on.issue_token,
            "set_config": on.set_config,
            "add_config": on.add_config,
            "list_configs": on.list_configs,
            "show_config": on.show_config,
            "remove_config": on.remove_config,
            "deploy": on.deploy,
            "show_rollout": on.show_rollout,
            "list_rollouts": on.list_rollouts,
            "cancel_rollout": on.cancel_rollout,
        },
        direct={
            # a region's devices, asked by the datastore service (R-RES-1)
            CountRegionDevices.SUBJECT: Request(
                on.region_devices, description=CountRegionDevices.__doc__
            ),
            # who a device asking to mount a datastore is (the datastore service asks)
            GetDeviceFacts.SUBJECT: Request(on.device_facts, description=GetDeviceFacts.__doc__),
            # which configurations a device was told to run (the scheduler, sealing its keys)
            GetDeviceConfigsTold.SUBJECT: Request(
                on.configs_told, description=GetDeviceConfigsTold.__doc__
            ),
        },
        events={"device-status": on.status_reported, "account-removed": on.account_removed},
        signals={subjects.wildcard(DeviceHeartbeat.SUBJECT): on.heartbeat},
        every=[
            Every(settings.tick_s, fleet.deployments.round, "rollout-timeouts", at_start=False),
            Every(settings.heartbeats_s, fleet.heartbeats.flush, "heartbeats", at_start=False),
        ],
        publishes=[DeviceAdded, DeviceRemoved, ApplyDeviceConfig],
    )
    return rt.built(fleet)
