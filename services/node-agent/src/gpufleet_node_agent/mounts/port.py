"""What mounts a datastore on this node: the port its adapters implement, what a probe of a
mount found, and the bounded subprocess every mount, unmount and probe runs in.

A command that touches a mount may hang (a hard NFS mount whose server went away, a `stat`
in the kernel's uninterruptible wait): it runs in a child process, never in the agent's
threads, and is killed once its time is up; a probe that is still running when the next
one is due is not doubled (keeper.py), so hung probes cannot pile up."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Protocol

from gpufleet_contracts.datastores import DatastoreMount


class Health(StrEnum):
    ok = "ok"
    unreachable = "unreachable"  # the server does not answer (or its share is gone)
    stale = "stale"  # the handle no longer names what the server serves


class Unreachable(Exception):
    """A datastore cannot be mounted now: `reason` says why (never a secret)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class NoDatastore(Exception):
    """No datastore of that name in this node's region and owner (removed, or never one)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Ran:
    """A bounded command's end: its exit status (None: killed when its time was up) and
    the start of what it wrote."""

    rc: int | None
    out: str

    @property
    def timed_out(self) -> bool:
        return self.rc is None


async def bounded(argv: list[str], timeout_s: float, env: dict[str, str] | None = None) -> Ran:
    """`argv` in a child process of its own session, killed (the whole group) past
    `timeout_s`; stdin closed, stdout and stderr together, at most 4 kB kept."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
        env=env if env is not None else {"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        # a child in the kernel's uninterruptible wait is reaped when it leaves it; not waited
        asyncio.get_running_loop().call_soon(_reap, proc)
        return Ran(None, "")
    return Ran(proc.returncode, out[:4096].decode(errors="replace").strip())


def _reap(proc: asyncio.subprocess.Process) -> None:
    task = asyncio.ensure_future(proc.wait())
    task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)


class Mounter(Protocol):
    """Mounts datastores at directories of this node. `password`: an SMB user's, opened
    just before; an adapter never logs it, never puts it in a command's arguments."""

    @property
    def name(self) -> str: ...

    async def mount(self, spec: DatastoreMount, at: Path, password: str | None) -> None:
        """`spec` mounted at `at` (an empty directory), or Unreachable."""
        ...

    async def unmount(self, at: Path) -> None:
        """`at` detached at once (lazily: what still uses it lets go later); nothing if it
        is not mounted."""
        ...

    async def probe(self, spec: DatastoreMount, at: Path) -> Health: ...


def is_mounted(at: Path, mountinfo: Path = Path("/proc/self/mountinfo")) -> bool:
    """Whether something is mounted at `at` (the kernel's mount table: `os.path.ismount`
    cannot tell a bind mount of a directory of the same filesystem). Reads no file under
    `at`, so a mount whose server is gone cannot hang it."""
    wanted = os.path.join(os.path.realpath(at.parent), at.name)  # never a stat of `at`
    with mountinfo.open(encoding="utf-8", errors="replace") as f:
        for line in f:
            fields = line.split(" ", 5)
            if len(fields) > 4 and _unescape(fields[4]) == wanted:
                return True
    return False


def _unescape(field: str) -> str:
    """mountinfo's octal escapes (`\040` for a space) undone."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


async def lazy_unmount(at: Path, timeout_s: float) -> None:
    """`umount -l at` until nothing is mounted there (a mount made twice is two)."""
    for _ in range(8):
        if not await asyncio.to_thread(is_mounted, at):
            return
        ran = await bounded(["umount", "-l", "--", str(at)], timeout_s)
        if ran.rc != 0:
            if await asyncio.to_thread(is_mounted, at):
                raise Unreachable(f"cannot unmount {at}: {ran.out[:200]}")
            return


async def identity(path: Path, timeout_s: float) -> str | None:
    """The path's `device:inode`, read by `stat` in a bounded child process; None when it
    did not answer in time; `!<why>` when it cannot be read (`!Stale file handle`)."""
    ran = await bounded(["stat", "-c", "%d:%i", "--", str(path)], timeout_s)
    if ran.timed_out:
        return None
    if ran.rc == 0:
        return ran.out.strip()
    return "!" + ran.out.rsplit(":", 1)[-1].strip()
