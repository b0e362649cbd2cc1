"""The configuration's attached third-party keys on the device (R-DEV-2), as a job's worker
gets its own (steps/keys.py).

Asked of the scheduler on the device's own subject (`nrpc.scheduler.device_keys.<minion_id>`,
which only its credential may publish) with a fresh X25519 key made for that one request and
kept in memory only; the reply is a box sealed to it, opened here. Registry keys (`docker`,
`ngc`) are the image pull's credential only; every other key becomes files

    <state>/secrets/<type>/<field>     0400; dirs 0500; a small tmpfs when the agent can mount

which the container sees read-only at `/run/secrets` (a host process: at that directory),
with `SECRETS_PATH` naming it. Nothing of them is kept in desired.json, logged or reported:
the files go when another configuration (or none) replaces this one or the agent stops, and
the keys are asked again at each start (after a reboot, an agent restart)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet_auth.sealing import SealError, SealingKey
from gpufleet_contracts.devices import DeviceConfigSpec, DeviceKeys, GetDeviceKeys
from gpufleet_contracts.images import RegistryAuth
from gpufleet_contracts.jobs import SecretFields
from pydantic import ValidationError

from ..noderpc import NotAnswered, NotThere, ask_service
from ..staging.platform import Requester
from ..steps.keys import CONTAINER_PATH, ENV_NAME, SECRETS_DIR, remove_keys, write_keys


class KeysUnavailable(Exception):
    """The configuration's keys cannot be had: `reason` says why (never a value)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class DeviceSecrets:
    """What the configuration's command and its image pull get of its keys."""

    files: Path | None = None  # the key files' directory, when it has any
    registry_auth: RegistryAuth | None = field(default=None, repr=False)

    def env(self, container: bool) -> dict[str, str]:
        """`SECRETS_PATH` for the command, when it has key files."""
        if self.files is None:
            return {}
        return {ENV_NAME: CONTAINER_PATH if container else str(self.files)}


def opened(reply: DeviceKeys, key: SealingKey) -> SecretFields:
    """The reply's box opened with the request's key (KeysUnavailable: it does not open)."""
    try:
        data = key.open(reply.sealed.box, reply.sealed.key_id)
        return SecretFields.model_validate_json(data)
    except SealError:
        raise KeysUnavailable(
            "the attached keys' box does not open with this request's key"
        ) from None
    except ValidationError:  # its errors quote the input: never raised on, never logged
        raise KeysUnavailable("the attached keys' box holds no keys") from None


class DeviceKeyFiles:
    def __init__(self, state_dir: Path, minion_id: str, request: Requester) -> None:
        self.dir = state_dir / SECRETS_DIR
        self.minion_id = minion_id
        self.request = request

    async def take(self, spec: DeviceConfigSpec) -> DeviceSecrets:
        """The keys `spec` attaches, asked, opened and written (KeysUnavailable: why not)."""
        self.release()
        if not spec.keys:
            return DeviceSecrets()
        key = SealingKey.generate()  # this request's only: never written anywhere
        asked = GetDeviceKeys(image=spec.image, types=spec.keys, public_key=key.public_key)
        try:
            reply = await ask_service(self.request, self.minion_id, asked, DeviceKeys)
        except NotThere as exc:
            raise KeysUnavailable(f"attached keys {', '.join(spec.keys)}: {exc}") from None
        except NotAnswered as exc:
            raise KeysUnavailable(f"attached keys {', '.join(spec.keys)}: {exc}") from None
        fields = opened(reply, key)
        if not fields.attached_keys:
            return DeviceSecrets(registry_auth=fields.registry_auth)
        self.dir.parent.mkdir(parents=True, exist_ok=True)
        error = write_keys(self.dir, fields.attached_keys, os.getuid())
        if error is not None:
            self.release()
            raise KeysUnavailable(error)
        return DeviceSecrets(self.dir, fields.registry_auth)

    def release(self) -> None:
        """The key files gone from the device. Safe twice."""
        remove_keys(self.dir)
