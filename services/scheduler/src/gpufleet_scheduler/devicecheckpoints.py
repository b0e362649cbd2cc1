"""A device's checkpoints (R-DEV-2: "any checkpoints the model's inference code requires"),
as a job's node stages its own (platform.py): the device never holds the store's
credentials and never chooses whose object it gets.

A device agent asks on `nrpc.scheduler.stage_device_checkpoint.<minion_id>`, which only that
device's credential may publish: the device is the subject's, never the body's. device-fleet
(asked on a subject only the scheduler may publish) says who owns it and which
configurations it was told to run (its current deployment's and the last it ran); a
checkpoint none of them names is "not found" (`check`). The datastore is then asked for a
read grant of the device's owner's object (its own `<name>`, or another account's public
`<owner>/<name>`, as a job reads them; another account's private one is "not found"), for
the device rather than a job. The grant's URL is a credential: no event is published and
nothing is logged but the checkpoint's name.
"""

from __future__ import annotations

import logging

from gpufleet_contracts.devices import (
    DeviceConfigsTold,
    GetDeviceConfigsTold,
    StageDeviceCheckpoint,
)
from gpufleet_contracts.errors import NotFound
from gpufleet_contracts.locations import PlatformAsset
from gpufleet_contracts.platform import GrantPlatformObject, PlatformGrant

from .platform import Ask

log = logging.getLogger("gpufleet.scheduler")


def check(asked: StageDeviceCheckpoint, told: DeviceConfigsTold) -> None:
    """NotFound unless a configuration the device was told to run names the checkpoint."""
    if any(asked.name in config.checkpoints for config in told.configs):
        return
    raise NotFound(f"no configuration of device {told.minion_id} names checkpoint {asked.name}")


def read_grant(asked: StageDeviceCheckpoint, told: DeviceConfigsTold) -> GrantPlatformObject:
    """What the datastore is asked: a read of the device's owner's checkpoint, for it."""
    return GrantPlatformObject(
        account=told.owner,
        asset=PlatformAsset.checkpoint,
        name=asked.name,
        mode="read",
        device=told.minion_id,
    )


class DeviceCheckpointGrants:
    def __init__(self, ask: Ask) -> None:
        self.ask = ask

    async def give(self, body: StageDeviceCheckpoint, device: str) -> PlatformGrant:
        if not device:
            raise NotFound("not a device's request")
        told = await self.ask(GetDeviceConfigsTold(minion_id=device), DeviceConfigsTold)
        check(body, told)
        grant = await self.ask(read_grant(body, told), PlatformGrant)
        log.info("device %s: checkpoint %s granted", device, grant.name)
        return grant
