"""The configuration's checkpoints on the device (R-DEV-2), where a job's worker finds its own
(R-JOB-4): one at `/opt/ml/checkpoint`, several at `/opt/ml/checkpoint/<Name>`, named by
`ML_CHECKPOINT_PATH` (and, several, `ML_CHECKPOINT_PATH_<NAME>`).

Each is asked of the scheduler on the device's own subject
(`nrpc.scheduler.stage_device_checkpoint.<minion_id>`, which only its credential may
publish): it grants a presigned GET only for a checkpoint a configuration the device was
told to run names, of the device's owner. The node's platform staging fetches it
(staging/platform.py: the store's one address reached, streamed, an archive unpacked) into

    <state>/checkpoints[/<Name>]     files 0444, dirs 0555

which the container sees read-only at `/opt/ml/checkpoint` (a host process: that directory).
They are fetched again at each start and removed when another configuration (or none)
replaces this one or the agent stops. The URL is in no reason and no log."""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet_contracts.devices import DeviceConfigSpec, StageDeviceCheckpoint
from gpufleet_contracts.jobspec import dir_name
from gpufleet_contracts.platform import PlatformGrant

from ..staging.guard import AddressGuard
from ..staging.platform import Platform, Requester
from ..staging.registry import Moved, Transfer
from ..steps.base import WorkerFailed

CHECKPOINT = "/opt/ml/checkpoint"
CHECKPOINTS_DIR = "checkpoints"
ENV = "ML_CHECKPOINT_PATH"


class CheckpointsUnavailable(Exception):
    """A checkpoint of the configuration cannot be had: `reason` says why (never a URL)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def env_suffix(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in dir_name(name)).upper()


def subdir(name: str) -> str:
    """The checkpoint's directory among several (a job's: its name, spaces as underscores);
    CheckpointsUnavailable for a name that would leave the checkpoints' directory."""
    rel = dir_name(name)
    if any(part in ("", ".", "..") for part in rel.split("/")):
        raise CheckpointsUnavailable(f"checkpoint {name[:200]}: not a usable name")
    return rel


@dataclass(frozen=True)
class StagedCheckpoints:
    """Where the configuration's checkpoints are on the device (`dir`, None: it names none)
    and each one's directory in it (empty: the only one, at the top)."""

    dir: Path | None = None
    each: dict[str, str] = field(default_factory=dict)  # name -> its directory in `dir`

    def env(self, container: bool) -> dict[str, str]:
        """`ML_CHECKPOINT_PATH` (and, several, `ML_CHECKPOINT_PATH_<NAME>`) for the command."""
        if self.dir is None:
            return {}
        top = CHECKPOINT if container else str(self.dir)
        env = {ENV: top}
        if len(self.each) > 1:
            env |= {f"{ENV}_{env_suffix(n)}": f"{top}/{rel}" for n, rel in self.each.items()}
        return env


def _quiet(moved: Moved) -> None:
    """A device reports no transfer progress: its state says `downloading`."""


def _read_only(root: Path) -> None:
    for path, _dirs, files in os.walk(root):
        for f in files:
            os.chmod(os.path.join(path, f), 0o444, follow_symlinks=False)
        os.chmod(path, 0o555)


def _made_free(dest: Path) -> int:
    """`dest` made; the bytes free where it is (what a checkpoint may take)."""
    dest.mkdir(parents=True, exist_ok=True)
    return shutil.disk_usage(dest).free


def _remove(root: Path) -> None:
    if not root.exists():
        return
    for path, _dirs, _files in os.walk(root):
        os.chmod(path, stat.S_IRWXU)
    shutil.rmtree(root, ignore_errors=True)


class DeviceCheckpoints:
    def __init__(
        self,
        state_dir: Path,
        minion_id: str,
        request: Requester,
        ca_file: Path | None = None,
    ) -> None:
        self.dir = state_dir / CHECKPOINTS_DIR
        self.platform = Platform(minion_id, request, AddressGuard(), ca_file)

    async def take(self, spec: DeviceConfigSpec) -> StagedCheckpoints:
        """The checkpoints `spec` names, granted, fetched and made read-only
        (CheckpointsUnavailable: why not)."""
        await self.release()
        if not spec.checkpoints:
            return StagedCheckpoints()
        several = len(spec.checkpoints) > 1
        each = {n: subdir(n) if several else "" for n in spec.checkpoints}
        try:
            for name, rel in each.items():
                await self._fetch(name, self.dir / rel if rel else self.dir)
            await asyncio.to_thread(_read_only, self.dir)
        except WorkerFailed as exc:
            await self.release()
            raise CheckpointsUnavailable(exc.reason) from None
        except OSError as exc:
            await self.release()
            raise CheckpointsUnavailable(f"checkpoints: {exc.strerror or exc}") from None
        return StagedCheckpoints(self.dir, each)

    async def _fetch(self, name: str, dest: Path) -> None:
        what = f"checkpoint {name[:200]}"
        asked = StageDeviceCheckpoint(name=name)
        grant = await self.platform.answer(asked, PlatformGrant, what, "refused")
        if grant.method != "GET":
            raise WorkerFailed(f"{what}: the control plane granted {grant.method}")
        free = await asyncio.to_thread(_made_free, dest)
        await self.platform.fetch_granted(grant, dest, Transfer({}, free, _quiet), what)

    async def release(self) -> None:
        """The checkpoints gone from the device. Safe twice."""
        await asyncio.to_thread(_remove, self.dir)
