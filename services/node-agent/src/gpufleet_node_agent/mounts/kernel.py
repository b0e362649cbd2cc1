"""The kernel adapter: `mount -t nfs` and `mount -t cifs`, always `nosuid,nodev`, with the
options the datastore names (checked again here against the allow-list); an NFS mount is
`soft` unless the datastore says `hard` (which it may only with `timeo` and `retrans`).

An SMB user's password goes to mount.cifs in a credentials file (0600, in a 0700 directory
of the agent's, made with O_EXCL and never followed through a symlink) that is removed as
soon as the mount command ends: never in a command's arguments, where any local user reads
it in /proc."""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gpufleet_contracts.datastores import DatastoreMount, DatastoreType, mount_problem

from .port import Health, Unreachable, bounded, identity, lazy_unmount

ALWAYS = ["nosuid", "nodev"]


def source(spec: DatastoreMount) -> str:
    """What `mount` is given: `host:/export/dir` (NFS) or `//host/share/dir` (SMB)."""
    host = spec.address
    with contextlib.suppress(ValueError):
        if ipaddress.ip_address(host).version == 6:
            host = f"[{host}]"
    if spec.type is DatastoreType.nfs:
        return f"{host}:{spec.root_path}"
    return f"//{host}{spec.root_path}"


def options(spec: DatastoreMount, credentials: Path | None) -> list[str]:
    """The `-o` list: ALWAYS, the datastore's, `soft` for NFS unless it said otherwise, and
    for SMB the credentials file (or `guest`)."""
    found = [*ALWAYS, *spec.mount_options]
    keys = {o.partition("=")[0] for o in spec.mount_options}
    if spec.type is DatastoreType.nfs:
        if not keys & {"soft", "hard"}:
            found.append("soft")
        return found
    found.append(f"credentials={credentials}" if credentials is not None else "guest")
    return found


def argv(spec: DatastoreMount, at: Path, credentials: Path | None) -> list[str]:
    kind = "nfs" if spec.type is DatastoreType.nfs else "cifs"
    opts = ",".join(options(spec, credentials))
    return ["mount", "-t", kind, "-o", opts, "--", source(spec), str(at)]


@contextmanager
def credentials_file(directory: Path, spec: DatastoreMount, password: str) -> Iterator[Path]:
    """`username=`/`password=` lines in a 0600 file of a 0700 directory, removed after."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    name = hashlib.sha256(f"{spec.region_id}/{spec.name}".encode()).hexdigest()[:24]
    path = directory / name
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(f"username={spec.username}\npassword={password}\n")
        yield path
    finally:
        path.unlink(missing_ok=True)


class KernelMounter:
    """NFS and SMB mounts by the kernel (the agent runs as root, or with CAP_SYS_ADMIN)."""

    name = "kernel"

    def __init__(self, secrets_dir: Path, timeout_s: float = 30.0) -> None:
        self.secrets_dir = secrets_dir
        self.timeout_s = timeout_s

    async def mount(self, spec: DatastoreMount, at: Path, password: str | None) -> None:
        problem = mount_problem(spec.type, spec.address, spec.root_path, spec.mount_options)
        if problem is not None:
            raise Unreachable(f"datastore {spec.name} cannot be mounted: {problem}")
        if spec.type is DatastoreType.smb and spec.username is not None:
            if password is None:
                raise Unreachable(f"datastore {spec.name}: no password for its user")
            with credentials_file(self.secrets_dir, spec, password) as creds:
                ran = await bounded(argv(spec, at, creds), self.timeout_s)
        else:
            ran = await bounded(argv(spec, at, None), self.timeout_s)
        if ran.timed_out:
            await lazy_unmount(at, self.timeout_s)
            raise Unreachable(f"datastore {spec.name} unreachable (its mount timed out)")
        if ran.rc != 0:
            raise Unreachable(f"datastore {spec.name} unreachable: {ran.out[:200]}")

    async def unmount(self, at: Path) -> None:
        await lazy_unmount(at, self.timeout_s)

    async def probe(self, spec: DatastoreMount, at: Path) -> Health:
        found = await identity(at, self.timeout_s)
        if found is None:
            return Health.unreachable
        if found.startswith("!"):
            return Health.stale if "stale" in found.lower() else Health.unreachable
        return Health.ok
