"""A crun container's cgroups on a cgroup v1 host, made and removed by the agent.

`crun run` has no `--keep`: the cgroups it makes are gone when it returns, and with them the
count of the container's OOM kills (a poststop hook runs after; on v1 a parent cgroup counts
no OOM of its children). So crun runs with its cgroup manager off, in cgroups the agent made
before and removes after, as runc's `--keep` left them: the same limits runc would write
(memory and memory+swap, CPU quota, pids, the device allow-list), under the same parent
(`/gpufleet/<container>` in each hierarchy), and the OOM count read once it has ended.

Hybrid hosts (v1 controllers, a cgroup2 mount at /sys/fs/cgroup/unified holding none we
use): crun refuses them ("cgroups in hybrid mode not supported"); `hide_unified()` runs it
in a private mount namespace of its own where that v2 mount is covered, so crun sees a plain
v1 host. Nothing of the host changes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

PARENT = "gpufleet"
CONTROLLERS = ("memory", "cpu", "cpuacct", "pids", "devices")
UNIFIED = Path("/sys/fs/cgroup/unified")
MOUNTINFO = Path("/proc/self/mountinfo")
# What every container may use (runc's and crun's default allow-list, less tun): mknod of
# any node (no container has CAP_MKNOD), null, zero, full, random, urandom, tty, console,
# ptmx and pts. The worker's own GPU nodes are added to it.
DEFAULT_DEVICES = (
    "c *:* m",
    "b *:* m",
    "c 1:3 rwm",
    "c 1:5 rwm",
    "c 1:7 rwm",
    "c 1:8 rwm",
    "c 1:9 rwm",
    "c 5:0 rwm",
    "c 5:1 rwm",
    "c 5:2 rwm",
    "c 136:* rwm",
)


@dataclass(frozen=True)
class Limits:
    memory_bytes: int
    cpu_quota_us: int
    cpu_period_us: int
    pids: int
    devices: Sequence[tuple[int, int]] = ()  # (major, minor) of its character devices


def mounts(mountinfo: str) -> tuple[dict[str, Path], bool]:
    """The v1 hierarchy of each controller we use, and whether a cgroup2 mount is there
    too, from /proc/self/mountinfo's text."""
    found: dict[str, Path] = {}
    v2 = False
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, extra = left.split(), right.split()
        if len(fields) < 5 or len(extra) < 3:
            continue
        if extra[0] == "cgroup2":
            v2 = True
        elif extra[0] == "cgroup":
            for option in extra[2].split(","):
                if option in CONTROLLERS:
                    found.setdefault(option, Path(fields[4]))
    return found, v2


def problem(found: Mapping[str, Path]) -> str | None:
    """Why the agent cannot give crun containers their cgroups here, or None."""
    missing = [c for c in CONTROLLERS if c not in found]
    if len(missing) == len(CONTROLLERS):
        return "no cgroup v1 controllers (a cgroup v2 host: runc starts its containers)"
    if missing:
        return f"cgroup v1 controllers missing: {', '.join(missing)}"
    return None


def _write(path: Path, value: str) -> None:
    """One write(2), as the cgroup files want it (no buffered text file: ~17 per container)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)  # as open("w")
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


class Cgroups:
    """The v1 cgroups of crun containers: one directory per container and hierarchy."""

    def __init__(self, found: Mapping[str, Path], hybrid: bool) -> None:
        self.found = dict(found)
        self.hybrid = hybrid
        # cpu and cpuacct are one hierarchy on most hosts, two on some: each directory once
        self.roots = list(dict.fromkeys(self.found[c] for c in CONTROLLERS))

    @classmethod
    def here(cls) -> tuple[Cgroups | None, str | None]:
        """This host's, or why there are none (not readable, a v2 host, ...)."""
        try:
            found, v2 = mounts(MOUNTINFO.read_text())
        except OSError as exc:
            return None, f"cannot read {MOUNTINFO}: {exc}"
        why = problem(found)
        if why is not None:
            return None, why
        return cls(found, hybrid=v2 and UNIFIED.is_dir()), None

    def dirs(self, name: str) -> list[Path]:
        return [root / PARENT / name for root in self.roots]

    def _dir(self, controller: str, name: str) -> Path:
        return self.found[controller] / PARENT / name

    def make(self, name: str, limits: Limits) -> list[Path]:
        """Its cgroups with their limits; the `cgroup.procs` files its supervisor joins."""
        for d in self.dirs(name):
            d.mkdir(parents=True, exist_ok=True)
        memory = self._dir("memory", name)
        _write(memory / "memory.limit_in_bytes", str(limits.memory_bytes))
        swap = memory / "memory.memsw.limit_in_bytes"
        if swap.exists():  # only with swap accounting on
            _write(swap, str(limits.memory_bytes))
        cpu = self._dir("cpu", name)
        _write(cpu / "cpu.cfs_period_us", str(limits.cpu_period_us))
        _write(cpu / "cpu.cfs_quota_us", str(limits.cpu_quota_us))
        _write(self._dir("pids", name) / "pids.max", str(limits.pids))
        devices = self._dir("devices", name)
        _write(devices / "devices.deny", "a")
        for rule in (*DEFAULT_DEVICES, *(f"c {a}:{b} rwm" for a, b in limits.devices)):
            _write(devices / "devices.allow", rule)
        return [d / "cgroup.procs" for d in self.dirs(name)]

    def pids(self, name: str) -> list[int]:
        with contextlib.suppress(OSError, ValueError):
            text = (self._dir("pids", name) / "cgroup.procs").read_text()
            return [int(p) for p in text.split()]
        return []

    def kill(self, name: str) -> None:
        """SIGKILL to everything in it (crun and the container: PID 1 takes the rest)."""
        for pid in self.pids(name):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    def oom_killed(self, name: str) -> bool:
        """Did the kernel kill a process of it for memory?"""
        with contextlib.suppress(OSError):
            for line in (self._dir("memory", name) / "memory.oom_control").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and value.strip().isdigit() and int(value) > 0:
                    return True
        return False

    def remove(self, name: str, wait_s: float = 1.0) -> bool:
        """Its cgroups gone (their last processes may take a moment to leave); False: some
        are still there (a process that would not die)."""
        deadline = time.monotonic() + wait_s
        left = self.dirs(name)
        while True:
            left = [d for d in left if not _rmdir(d)]
            if not left or time.monotonic() >= deadline:
                return not left
            self.kill(name)
            time.sleep(0.01)


def _rmdir(d: Path) -> bool:
    try:
        d.rmdir()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def hide_unified() -> list[str]:
    """The argv prefix that runs a command (crun) in a mount namespace of its own where the
    cgroup2 mount is covered by a proc mount (util-linux unshare's `--mount-proc`; private
    propagation, so the host sees nothing of it): crun then finds a plain v1 host. One exec,
    no shell and `umount` process (issue 15: ~2.7 ms of CPU a container here)."""
    return ["unshare", "--mount", "--propagation", "private", f"--mount-proc={UNIFIED}"]
