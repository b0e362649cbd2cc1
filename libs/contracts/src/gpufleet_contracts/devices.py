"""Edge devices (PRODUCT.md section 4): devices, their configurations and rollouts, as the
device-fleet service, the CLI, billing and a device agent see them.

An account's requests go to `rpc.device-fleet.<verb>.<account>` (the acting account from the
credential); a device reports on `evt.device.status.<minion_id>`, which only that device's
credential may publish, and is told what to run on its own command subject
`cmd.node.<minion_id>.apply_device_config`, which only device-fleet may publish.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated

from pydantic import BaseModel, Field, field_validator
from pydantic_core import PydanticCustomError

from . import limits, subjects
from .base import Command, Event
from .datastores import NodeFacts
from .errors import rule
from .fields import EnvValue, Int, Name
from .identity import NAME, JoinTokenIssued
from .jobs import SealedSecrets
from .jobspec import THIRD_PARTY_KEYS
from .nodes import GpuSample, SealingKey
from .platform import PlatformGrant
from .spec import env_names

DeviceName = Annotated[Name, Field(min_length=1, max_length=limits.NAME_CHARS)]
DEFAULT_OUTPUT_PATH = "/opt/ml/output"


class DeviceModel(StrEnum):
    """The Jetson models a device may be (R-DEV-1)."""

    agx_xavier = "jetson-agx-xavier"
    xavier_nx = "jetson-xavier-nx"
    agx_orin = "jetson-agx-orin"
    orin_nx = "jetson-orin-nx"
    orin_nano = "jetson-orin-nano"


class DeviceState(StrEnum):
    """A device's place in the fleet: `provisioning` until its agent first reports, then
    `active` (R-DEV-1: automatically); `removed` stays stored for its history."""

    provisioning = "provisioning"
    active = "active"
    removed = "removed"


class DeployState(StrEnum):
    """Where a device is with its configuration (R-DEV-3): `idle` (nothing deployed yet),
    `waiting` (in a rollout, its turn not come), then `pending -> downloading -> starting ->
    running`, or `failed` (with a reason) or `cancelled` (its rollout was)."""

    idle = "idle"
    waiting = "waiting"
    pending = "pending"
    downloading = "downloading"
    starting = "starting"
    running = "running"
    failed = "failed"
    cancelled = "cancelled"


IN_PROGRESS = frozenset({DeployState.pending, DeployState.downloading, DeployState.starting})


class InferenceStatus(StrEnum):
    """Whether the configuration's command runs (R-DEV-3): `stopped` when it exited by itself
    with status 0 (it is not restarted), `failed` when it exited otherwise."""

    running = "running"
    stopped = "stopped"
    failed = "failed"


class DevicePresence(StrEnum):
    """Whether a device's agent is heard: `online` while its last heartbeat (or report) is
    younger than a few of its heartbeat periods, `offline` after that or before the first.
    An offline device is still charged its daily fee (R-BILL-3)."""

    online = "online"
    offline = "offline"


# --- events ---------------------------------------------------------------------------------


class DeviceAdded(Event):
    TYPE = "gpufleet.device.added.v1"
    SUBJECT = subjects.event("device", "added")
    device_id: str
    account: str
    region: Name
    model: str
    at: datetime


class DeviceRemoved(Event):
    """A device left its account's fleet (its own request, or its account's removal): billing
    charges it no more after its day (R-BILL-3); the provisioner revokes the enrolment of
    `minion_id` that the device's join token gave, if made before `at`."""

    TYPE = "gpufleet.device.removed.v1"
    SUBJECT = subjects.event("device", "removed")
    device_id: str
    account: str
    region: Name
    at: datetime
    minion_id: str | None = None  # None: an event of a release that did not name it


class DeviceStatusReported(Event):
    """A device's own report of its configuration's deployment and its inference command, on
    its own subject: device-fleet takes it only there (the account and the device come from
    the subject, never from the body). Its first report makes a provisioning device active."""

    TYPE = "gpufleet.device.status_reported.v1"
    SUBJECT = subjects.EVENTS + ".device.status.{minion_id}"
    minion_id: str
    deployment_id: str | None = None  # the deployment the state is about (None: none yet)
    state: DeployState = DeployState.idle
    reason: str | None = Field(default=None, max_length=1024)
    inference: InferenceStatus | None = None
    at: datetime


class DeviceTelemetry(BaseModel):
    """A device's host in one heartbeat: CPU busy %, RAM, the disk of its agent's state
    directory, and its SoC GPU (None where it is not read: a real Jetson has no NVML)."""

    cpu_pct: float | None = None
    ram_used_mb: Int | None = None
    ram_total_mb: Int | None = None
    disk_used_pct: float | None = None
    disk_free_gb: float | None = None
    gpu: GpuSample | None = None


class DeviceHeartbeat(Event):
    """Core NATS, every `period_s` (a lost one is harmless), on the device's own subject
    `gpufleet.v1.hb.device.<minion_id>`, which only that device's credential may publish:
    device-fleet takes the device from the subject, never from the body. Apart from compute
    nodes' `hb.<minion_id>` (the provisioner's): a device never refreshes a node."""

    TYPE = "gpufleet.device.heartbeat.v1"
    SUBJECT = subjects.HEARTBEATS + ".device.{minion_id}"
    minion_id: str
    at: datetime  # when the device sent it
    seq: Int | None = None  # counted since its agent started
    period_s: float = Field(gt=0, le=3600)  # its heartbeat period (how soon it is offline)
    telemetry: DeviceTelemetry = Field(default_factory=DeviceTelemetry)


# --- configurations (R-DEV-2) -------------------------------------------------------------


class DeviceConfigSpec(BaseModel):
    """What a device runs: image, model and start command required; checkpoints, a regional
    datastore (a path inside it, mounted at `output_path`), environment variables and the
    account's attached third-party keys by type, optional."""

    image: str = Field(min_length=1, max_length=limits.ARG_CHARS, json_schema_extra=rule("R-DEV-2"))
    model: str = Field(min_length=1, max_length=limits.ARG_CHARS, json_schema_extra=rule("R-DEV-2"))
    start_command: str = Field(
        min_length=1, max_length=limits.ARG_CHARS, json_schema_extra=rule("R-DEV-2")
    )
    checkpoints: list[Annotated[str, Field(min_length=1, max_length=limits.ARG_CHARS)]] = Field(
        default_factory=list, max_length=16, json_schema_extra=rule("R-DEV-2")
    )
    datastore: DeviceName | None = Field(default=None, json_schema_extra=rule("R-DEV-2"))
    datastore_path: str = Field(default="/", json_schema_extra=rule("R-RES-2"))
    output_path: str = Field(default=DEFAULT_OUTPUT_PATH, json_schema_extra=rule("R-DEV-2"))
    env: dict[str, EnvValue] = Field(
        default_factory=dict, max_length=limits.ENV_VARS, json_schema_extra=rule("R-DEV-2")
    )
    keys: list[str] = Field(
        default_factory=list,
        json_schema_extra=rule("R-DEV-2", **{"x-valid": ", ".join(THIRD_PARTY_KEYS)}),
    )

    @field_validator("env")
    @classmethod
    def _env_names(cls, value: dict[str, str]) -> dict[str, str]:
        return env_names(value, "R-DEV-2")

    @field_validator("keys")
    @classmethod
    def _key_types(cls, value: list[str]) -> list[str]:
        for k in value:
            if k not in THIRD_PARTY_KEYS:
                raise PydanticCustomError(
                    "key_type",
                    "unknown key type '{key}'",
                    {"key": k, "rule": "R-DEV-2", "valid": ", ".join(THIRD_PARTY_KEYS)},
                )
        return sorted(set(value))


class DeviceConfigView(DeviceConfigSpec):
    """A configuration as its owner reads it."""

    region: str
    name: str
    created_at: datetime
    devices: int = 0  # how many devices use it now


class DeviceConfigList(BaseModel):
    configs: list[DeviceConfigView]


class AddDeviceConfig(DeviceConfigSpec, Command):
    """A configuration in one of the acting account's regions (R-DEV-2): its name unique in
    that region (reusable in another)."""

    TYPE = "gpufleet.device.add_config.v1"
    SUBJECT = subjects.rpc("device-fleet", "add_config")
    REPLY = DeviceConfigView
    region: DeviceName
    name: DeviceName


class DeviceConfigRequest(Command):
    """A request about one configuration: its region and name."""

    region: DeviceName
    name: DeviceName


class ShowDeviceConfig(DeviceConfigRequest):
    READ = True
    TYPE = "gpufleet.device.show_config.v1"
    SUBJECT = subjects.rpc("device-fleet", "show_config")
    REPLY = DeviceConfigView


class RemoveDeviceConfig(DeviceConfigRequest):
    """Refused (`conflict`) while a device uses it."""

    TYPE = "gpufleet.device.remove_config.v1"
    SUBJECT = subjects.rpc("device-fleet", "remove_config")
    REPLY = DeviceConfigView


class ListDeviceConfigs(Command):
    READ = True
    TYPE = "gpufleet.device.list_configs.v1"
    SUBJECT = subjects.rpc("device-fleet", "list_configs")
    REPLY = DeviceConfigList
    region: DeviceName | None = None


# --- devices (R-DEV-1, R-NODE-1, R-NODE-3) ---------------------------------------------------


class DeviceView(BaseModel):
    """A device as its owner reads it: its fleet state, its configuration and how far its
    deployment got (with the reason), its inference status and when its configuration was
    last deployed (R-DEV-3)."""

    device_id: str
    name: str
    minion_id: str
    region: str
    model: DeviceModel
    state: DeviceState
    config: str | None = None
    deploy_state: DeployState = DeployState.idle
    deploy_reason: str | None = None
    deployment_id: str | None = None
    inference: InferenceStatus | None = None
    deployed_at: datetime | None = None  # when its configuration was last deployed (running)
    presence: DevicePresence = DevicePresence.offline  # from its heartbeats' age
    last_seen: datetime | None = None  # its last heartbeat or report
    telemetry: DeviceTelemetry | None = None  # its last heartbeat's
    added_at: datetime
    removed_at: datetime | None = None


class DeviceList(BaseModel):
    devices: list[DeviceView]


class AddDevice(Command):
    """Add a device by name and minion id (R-DEV-1) in one of the acting account's physical
    regions with central storage and an active storage node (R-NODE-3)."""

    TYPE = "gpufleet.device.add.v1"
    SUBJECT = subjects.rpc("device-fleet", "add_device")
    REPLY = DeviceView
    region: DeviceName
    name: DeviceName
    minion_id: str = Field(pattern=NAME, json_schema_extra=rule("R-DEV-1"))
    model: DeviceModel = Field(json_schema_extra=rule("R-DEV-1"))


class DeviceRequest(Command):
    """A request about one device of the account: its name, minion id or device id."""

    device: str = Field(min_length=1, max_length=limits.NAME_CHARS)


class ShowDevice(DeviceRequest):
    READ = True
    TYPE = "gpufleet.device.show.v1"
    SUBJECT = subjects.rpc("device-fleet", "show_device")
    REPLY = DeviceView


class RemoveDevice(DeviceRequest):
    """Remove a device: it is charged no more after its day (R-BILL-3)."""

    TYPE = "gpufleet.device.remove.v1"
    SUBJECT = subjects.rpc("device-fleet", "remove_device")
    REPLY = DeviceView


class SetDeviceConfig(DeviceRequest):
    """The configuration a device runs (one at a time, from its own region; None: none).
    Deploying it is a rollout (DeployConfig)."""

    TYPE = "gpufleet.device.set_config.v1"
    SUBJECT = subjects.rpc("device-fleet", "set_config")
    REPLY = DeviceView
    config: DeviceName | None


class ListDevices(Command):
    READ = True
    TYPE = "gpufleet.device.list.v1"
    SUBJECT = subjects.rpc("device-fleet", "list_devices")
    REPLY = DeviceList
    region: DeviceName | None = None
    include_removed: bool = False


class DeviceTokenIssued(BaseModel):
    """A device's one-time join token, shown once (the node agent's `GPUFLEET_JOIN_TOKEN`)."""

    device: str
    minion_id: str
    region: str
    expires_at: int
    token: str = Field(repr=False)


class IssueDeviceToken(DeviceRequest):
    """A one-time join token for one of the account's devices: its credential may publish
    only that device's own subjects."""

    TYPE = "gpufleet.device.issue_token.v1"
    SUBJECT = subjects.rpc("device-fleet", "issue_token")
    REPLY = DeviceTokenIssued
    ttl_s: int = Field(default=24 * 3600, ge=60, le=30 * 24 * 3600, strict=True)


# --- rollouts (R-DEV-3) ----------------------------------------------------------------------


class RolloutPolicy(BaseModel):
    """A canary of `canary` devices first, then batches of `batch_size`; stopped when failed
    devices reach `max_failed_percent` of those tried (once `min_tried` were); a device not
    running within `device_timeout_s` of being told has failed."""

    canary: Int = Field(default=1, ge=0, le=1000)
    batch_size: Int = Field(default=10, ge=1, le=1000)
    max_failed_percent: Int = Field(default=20, ge=0, le=100)
    min_tried: Int = Field(default=1, ge=1, le=10000)
    device_timeout_s: Int = Field(default=900, ge=5, le=7 * 24 * 3600)


class RolloutPhase(StrEnum):
    canary = "canary"
    batches = "batches"
    succeeded = "succeeded"
    stopped = "stopped"  # failures passed the threshold (or the canary failed)
    cancelled = "cancelled"


class RolloutDeviceView(BaseModel):
    device_id: str
    name: str
    wave: int  # 0: the canary
    state: DeployState
    reason: str | None = None
    updated_at: datetime | None = None


class RolloutView(BaseModel):
    rollout_id: str
    region: str
    config: str
    phase: RolloutPhase
    reason: str | None = None
    policy: RolloutPolicy
    devices: list[RolloutDeviceView]
    created_at: datetime
    finished_at: datetime | None = None


class RolloutList(BaseModel):
    rollouts: list[RolloutView]


class DeployConfig(Command):
    """Deploy as a rollout: the devices named (each its own configuration, all of one), or,
    with `config` (and `region`), every device using that configuration ("deploy latest")."""

    TYPE = "gpufleet.device.deploy.v1"
    SUBJECT = subjects.rpc("device-fleet", "deploy")
    REPLY = RolloutView
    devices: list[Annotated[str, Field(min_length=1, max_length=limits.NAME_CHARS)]] = Field(
        default_factory=list, max_length=10000
    )
    region: DeviceName | None = None
    config: DeviceName | None = None
    policy: RolloutPolicy = Field(default_factory=RolloutPolicy)


class RolloutRequest(Command):
    rollout_id: str = Field(min_length=1, max_length=64)


class ShowRollout(RolloutRequest):
    READ = True
    TYPE = "gpufleet.device.show_rollout.v1"
    SUBJECT = subjects.rpc("device-fleet", "show_rollout")
    REPLY = RolloutView


class CancelRollout(RolloutRequest):
    """Cancel at any stage: devices not told yet are never told, devices on their way are
    told to go back to what they ran before; none is left in progress."""

    TYPE = "gpufleet.device.cancel_rollout.v1"
    SUBJECT = subjects.rpc("device-fleet", "cancel_rollout")
    REPLY = RolloutView


class ListRollouts(Command):
    READ = True
    TYPE = "gpufleet.device.list_rollouts.v1"
    SUBJECT = subjects.rpc("device-fleet", "list_rollouts")
    REPLY = RolloutList
    limit: Int = Field(default=20, ge=1, le=500)


# --- to a device (cmd.node.<minion_id>.apply_device_config: device-fleet only) ---------------


class ApplyDeviceConfig(Command):
    """Run this configuration (None: run nothing) as deployment `deployment_id`; the agent
    reports its progress with DeviceStatusReported and keeps running it across its own and the
    device's restarts."""

    TYPE = "gpufleet.device.apply_config.v1"
    SUBJECT = subjects.command("node", "apply_device_config")
    minion_id: str
    deployment_id: str
    config_name: str | None = None
    config: DeviceConfigSpec | None = None


# --- what the datastore service asks device-fleet (svc.device-fleet.<verb>) -----------------


class RegionDevices(BaseModel):
    region_id: str
    devices: Int  # not removed


class CountRegionDevices(Command):
    """How many devices (not removed) a region has, by its owner's region id `<owner>/<name>`
    (R-RES-1: regional resources need a compute node or a device there). The datastore
    service asks."""

    READ = True
    TYPE = "gpufleet.device.count_region_devices.v1"
    SUBJECT = subjects.service_call("device-fleet", "region_devices")
    REPLY = RegionDevices
    region_id: str = Field(min_length=3, max_length=2 * limits.NAME_CHARS + 1)


class GetDeviceFacts(Command):
    """Who a device is (its owner and region, as NodeFacts; NotFound if there is no such
    live device): the datastore service asks when a device asks to mount a datastore of its
    region, which the provisioner does not know (devices are device-fleet's)."""

    READ = True
    TYPE = "gpufleet.device.device_facts.v1"
    SUBJECT = subjects.service_call("device-fleet", "device_facts")
    REPLY = NodeFacts
    minion_id: str = Field(pattern=NAME)


# --- a device's attached keys (nrpc.scheduler.device_keys.<minion_id>: that device's only) ---


class DeviceKeys(BaseModel):
    """The attached keys a device asked for, sealed (`SecretFields` as JSON: its image pull's
    credential and its other keys) to the public key its request carried: no reply, event,
    log or dead letter holds a value."""

    types: list[str]
    sealed: SealedSecrets


class GetDeviceKeys(Command):
    """A device agent's request for the account's attached keys its configuration names
    (R-DEV-2), for the configuration of `image`. The scheduler reads the device from the
    subject (only that device's credential may publish it), asks device-fleet which
    configurations the device was told to run, and seals its owner's keys to `public_key`
    (a fresh key of the agent's, kept in its memory only). Keys that no configuration of
    this device attaches, or that its owner has not attached, are "not found"."""

    TYPE = "gpufleet.scheduler.device_keys.v1"
    SUBJECT = subjects.node_request("scheduler", "device_keys")
    REPLY = DeviceKeys
    image: str = Field(min_length=1, max_length=limits.ARG_CHARS)
    types: list[str] = Field(min_length=1, max_length=len(THIRD_PARTY_KEYS))
    public_key: SealingKey


class DeviceConfigKeys(BaseModel):
    """A configuration a device was told to run, as far as its keys and checkpoints go."""

    image: str
    keys: list[str]
    checkpoints: list[str] = Field(default_factory=list)


class DeviceConfigsTold(BaseModel):
    """Who a device is (its owner) and the configurations it was told to run: the one of its
    current deployment and the last one it ran to `running` (a revert goes back to it)."""

    minion_id: str
    owner: str
    configs: list[DeviceConfigKeys]


class GetDeviceConfigsTold(Command):
    """Which configurations the live device `minion_id` was told to run (NotFound if there
    is no such device): the scheduler asks before it seals a device's attached keys or
    grants it a checkpoint."""

    READ = True
    TYPE = "gpufleet.device.configs_told.v1"
    SUBJECT = subjects.service_call("device-fleet", "configs_told")
    REPLY = DeviceConfigsTold
    minion_id: str = Field(pattern=NAME)


# --- a device's checkpoints (nrpc.scheduler.stage_device_checkpoint.<minion_id>: its only) ---


class StageDeviceCheckpoint(Command):
    """A device agent's request for a checkpoint its configuration names (R-DEV-2): `name`
    as the configuration says it (its owner's `<name>`, or another account's public
    `<owner>/<name>`). The scheduler reads the device from the subject (only that device's
    credential may publish it), asks device-fleet which configurations the device was told
    to run and, when one of them names it, asks the datastore for a read grant of the
    device's owner's object: a presigned GET, never logged. Anything else is "not found"."""

    TYPE = "gpufleet.scheduler.stage_device_checkpoint.v1"
    SUBJECT = subjects.node_request("scheduler", "stage_device_checkpoint")
    REPLY = PlatformGrant
    name: str = Field(min_length=1, max_length=limits.ARG_CHARS)


# --- what device-fleet asks the provisioner (svc.provisioner.<verb>; its region facts are
# gpufleet_contracts.datastores.GetRegionFacts) -------------------------------------------------


class IssueDeviceJoinToken(Command):
    """A one-time join token for a device of `account`: enrolling with it gives a device's
    credential (gpufleet_auth.permissions DEVICE), not a compute node's."""

    TYPE = "gpufleet.provisioner.issue_device_join_token.v1"
    SUBJECT = subjects.service_call("provisioner", "issue_device_join_token")
    REPLY = JoinTokenIssued
    account: str
    minion_id: str
    region: str
    ttl_s: int = 24 * 3600
