"""A device's attached third-party keys (R-DEV-2, as a job's: R-JOB-7), sealed to a key its
agent sent.

A device agent asks on `nrpc.scheduler.device_keys.<minion_id>`, which only that device's
credential may publish: the device is the subject's, never the body's. device-fleet (asked on
a subject only the scheduler may publish) says who owns it and which configurations it was
told to run (its current deployment's and the last it ran); the device gets keys only when
one of those has the image it asks for and attaches every type it asks for (`check`), and
only its owner's (keystore.py): registry keys as its image pull's credential, for a registry
they are for (keyuse.py), every other key as the inference command's files. Everything goes
in one box sealed to the public key of the request (`seal`): the reply holds the box and
the types, no event is published, and nothing is logged but the types.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from gpufleet_auth import sealing as boxes
from gpufleet_contracts.devices import (
    DeviceConfigsTold,
    DeviceKeys,
    GetDeviceConfigsTold,
    GetDeviceKeys,
)
from gpufleet_contracts.errors import NotFound, Refused
from gpufleet_contracts.images import REGISTRY_KEYS, RegistryAuth
from gpufleet_contracts.jobs import SealedSecrets, SecretFields

from .keystore import open_keys
from .keyuse import WorkerSecrets, registry_auth, serves
from .platform import Ask
from .state import State

log = logging.getLogger("gpufleet.scheduler")


def check(asked: GetDeviceKeys, told: DeviceConfigsTold) -> None:
    """NotFound unless a configuration the device was told to run has the image it asks for
    and attaches every key type it asks for."""
    for config in told.configs:
        if config.image == asked.image and set(asked.types) <= set(config.keys):
            return
    raise NotFound(
        f"no configuration of device {told.minion_id} with image {asked.image[:200]} "
        f"attaches {', '.join(sorted(asked.types))}"
    )


def secrets(image: str, types: list[str], stored: Mapping[str, Mapping[str, str]]) -> WorkerSecrets:
    """What the device gets of its owner's keys `stored` (NotFound: one is not attached):
    a registry key as the pull credential of `image` (when it is for its registry), every
    other key as the command's."""
    missing = [t for t in types if t not in stored]
    if missing:
        raise NotFound(f"key(s) {', '.join(sorted(missing))} not attached to the device's account")
    auth: RegistryAuth | None = None
    attached: dict[str, dict[str, str]] = {}
    for key in types:
        values = stored[key]
        if key in REGISTRY_KEYS:
            if auth is None and serves(key, values, image):
                auth = registry_auth(key, values)
        else:
            attached[key] = dict(values)
    return WorkerSecrets({}, auth, attached)


def sealed_reply(types: list[str], found: WorkerSecrets, public_key: str) -> DeviceKeys:
    """`found` sealed to `public_key` (the device's fresh key): only its agent opens it."""
    fields = SecretFields(registry_auth=found.registry_auth, attached_keys=found.attached)
    try:
        box = boxes.seal(public_key, fields.model_dump_json(exclude_defaults=True).encode())
    except ValueError:
        raise Refused("invalid", "nothing can be sealed to this public key") from None
    return DeviceKeys(
        types=sorted(types), sealed=SealedSecrets(key_id=boxes.key_id(public_key), box=box)
    )


class DeviceKeyGrants:
    def __init__(self, state: State, ask: Ask) -> None:
        self.state = state
        self.ask = ask

    async def give(self, body: GetDeviceKeys, device: str) -> DeviceKeys:
        if not device:
            raise NotFound("not a device's request")
        told = await self.ask(GetDeviceConfigsTold(minion_id=device), DeviceConfigsTold)
        check(body, told)
        stored = (await open_keys(self.state.store, self.state.box, [told.owner]))[told.owner]
        reply = sealed_reply(body.types, secrets(body.image, body.types, stored), body.public_key)
        log.info("device %s: keys %s sealed to it", device, reply.types)
        return reply
