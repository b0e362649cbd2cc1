"""The bind adapter, where a real NFS or SMB mount cannot run (development, tests, a kernel
without those clients; `GPUFLEET_DATASTORE_MOUNTER=bind`): the datastore's share is a local
directory, `<bind root>/<address>/<root path>`, bind-mounted `nosuid,nodev` in its place.

It behaves as a server does where the keeper can tell: the share's directory removed is a
server gone (`unreachable`), a directory put back in its place is a stale handle (the mount
still shows the old one: their device and inode differ)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from gpufleet_contracts.datastores import DatastoreMount
from gpufleet_contracts.paths import UnsafePath, rooted_join

from .port import Health, Unreachable, bounded, identity, lazy_unmount


class BindMounter:
    name = "bind"

    def __init__(self, root: Path, timeout_s: float = 10.0) -> None:
        self.root = root
        self.timeout_s = timeout_s

    def share(self, spec: DatastoreMount) -> Path:
        """Where `spec`'s share is on this machine (its root joined as a job's path is)."""
        try:
            return Path(rooted_join(str(self.root / spec.address), spec.root_path))
        except UnsafePath as exc:
            raise Unreachable(f"datastore {spec.name} cannot be mounted: {exc}") from None

    async def mount(self, spec: DatastoreMount, at: Path, password: str | None) -> None:
        share = self.share(spec)
        if not await asyncio.to_thread(os.path.isdir, share):
            raise Unreachable(f"datastore {spec.name} unreachable ({share} is not there)")
        for argv in (
            ["mount", "--bind", "--", str(share), str(at)],
            ["mount", "-o", "remount,bind,nosuid,nodev", "--", str(at)],
        ):
            ran = await bounded(argv, self.timeout_s)
            if ran.rc != 0:
                await lazy_unmount(at, self.timeout_s)
                raise Unreachable(f"datastore {spec.name} unreachable: {ran.out[:200]}")

    async def unmount(self, at: Path) -> None:
        await lazy_unmount(at, self.timeout_s)

    async def probe(self, spec: DatastoreMount, at: Path) -> Health:
        mounted, share = await asyncio.gather(
            identity(at, self.timeout_s), identity(self.share(spec), self.timeout_s)
        )
        if mounted is None or share is None or share.startswith("!"):
            return Health.unreachable
        return Health.ok if mounted == share else Health.stale
