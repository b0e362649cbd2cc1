"""Where a configuration's output path comes from on the device (R-DEV-2): the device's own
`output/` directory, or, when the configuration names a regional datastore, the path in it.

The datastore goes through the node agent's keeper (mounts/: the adapter
GPUFLEET_DATASTORE_MOUNTER names, the details asked of the datastore service on the device's
own subject, which answers for its own region and owner only; probed every round and mounted
again when its server went away or its handle went stale). The path is joined to its root by
the one join jobs use (staging/datastores.py: `rooted_join`, symlinks resolved and kept inside
the root) and must exist. The configuration holds the datastore until another one (or none)
replaces it, or the agent stops."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from gpufleet_contracts.devices import DeviceConfigSpec
from gpufleet_contracts.locations import DatastoreRef

from ..mounts.keeper import DatastoreMounts
from ..mounts.port import NoDatastore, Unreachable
from ..staging.datastores import Datastores
from ..steps.base import WorkerFailed

HOLDER = "device-config"  # the one configuration a device runs


class OutputUnavailable(Exception):
    """The configuration's output cannot be had now: `reason` says why (never a secret)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class DeviceOutput:
    def __init__(self, state_dir: Path, mounts: DatastoreMounts) -> None:
        self.own = state_dir / "output"
        self.mounts = mounts
        self.held: str | None = None  # the datastore the configuration holds

    async def take(self, spec: DeviceConfigSpec) -> Path:
        """The directory to mount at `spec.output_path` (a host process: its GPUFLEET_OUTPUT),
        or OutputUnavailable."""
        if self.held is not None and self.held != spec.datastore:
            await self.release()
        if spec.datastore is None:
            self.own.mkdir(parents=True, exist_ok=True)
            return self.own
        self.held = spec.datastore
        try:
            await self.mounts.hold(spec.datastore, HOLDER)
        except (Unreachable, NoDatastore) as exc:
            raise OutputUnavailable(exc.reason) from None
        ref = DatastoreRef(datastore=spec.datastore, path=spec.datastore_path)
        return await asyncio.to_thread(self._resolve, ref)  # a stat may wait on the server

    def _resolve(self, ref: DatastoreRef) -> Path:
        try:
            found = Datastores(self.mounts.roots, region="").resolve(ref)
        except WorkerFailed as exc:
            raise OutputUnavailable(exc.reason) from None
        path = Path(os.path.join(found.root, found.rel))
        if not path.is_dir():
            raise OutputUnavailable(f"{found.shown} is not a directory")
        return path

    async def release(self) -> None:
        """The datastore let go (unmounted: nothing else holds it). Safe twice."""
        name, self.held = self.held, None
        if name is not None:
            await self.mounts.release(name, HOLDER)
