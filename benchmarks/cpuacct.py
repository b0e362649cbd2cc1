"""CPU time of a benchmark's processes, by group (import it as benchmarks/fleetstack.py).

`CpuGroups` puts every process a benchmark starts into a cgroup of its group, right after
the start (cgroup v1 `cpuacct` where it is mounted, else cgroup v2 `cpu.stat`; root only):
what the process forks stays in it, so its usage counts every descendant, exited, detached
(a node agent's per-worker supervisors, the bare jobs, the podman CLI calls) or alive,
exactly. Where no cgroup can be made it falls back to psutil over the process trees: the sum,
over each group's live processes and their descendants, of their own times plus their
waited-for children's (psutil's children_user/system), sampled by `sample()`, so a process
that exited is counted once its parent reaped it, and a detached one that exited is lost
(a lower bound). `method` says which one a figure comes from.

podman moves conmon and the containers into cgroups of its own (libpod_parent), so they are
outside every group: `ConmonSampler` samples the conmon processes of our containers (their
own and reaped children's times, so the container's processes once reaped) as a lower bound.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import psutil

TICKS = os.sysconf("SC_CLK_TCK")
V1 = Path("/sys/fs/cgroup/cpuacct")
V2_CANDIDATES = (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))


def machine_cpu() -> tuple[float, float]:
    """(busy, idle) CPU seconds of the whole machine since boot (/proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / TICKS, idle / TICKS


def proc_cpu(pid: int | None) -> float:
    """utime + stime of `pid` and of its waited-for children, seconds (0 when gone)."""
    if pid is None:
        return 0.0
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    f = stat[stat.rindex(")") + 2 :].split()
    return sum(int(x) for x in f[11:15]) / TICKS


def own_cpu(pid: int) -> float:
    """utime + stime of `pid` alone, seconds (0 when gone)."""
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return float(t.user + t.system)


def tree_cpu(pid: int) -> float:
    """Own + reaped children's times of `pid` and of every live descendant, seconds."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0.0
    total = 0.0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
    return total


def _cgroup_base(tag: str) -> tuple[Path, str] | None:
    """Where this process may make cgroups: (directory for `tag`, 'v1'/'v2'), or None."""
    if os.geteuid() != 0:
        return None
    candidates = [(V1, "v1")] if (V1 / "cpuacct.usage").exists() else []
    candidates += [(p, "v2") for p in V2_CANDIDATES if (p / "cgroup.procs").exists()]
    for base, kind in candidates:
        path = base / tag
        try:
            path.mkdir(exist_ok=True)
        except OSError:
            continue
        return path, kind
    return None


class CpuGroups:
    """CPU seconds by group since start, of every process `add`ed (and what it forks)."""

    def __init__(self, tag: str) -> None:
        found = _cgroup_base(tag)
        self.dir: Path | None = found[0] if found else None
        self.kind = found[1] if found else ""
        self.method = f"cgroup {self.kind}" if found else "psutil process trees (lower bound)"
        self.pids: dict[str, list[int]] = {}
        self._last: dict[int, float] = {}  # psutil fallback: the last tree sample of a root

    def add(self, group: str, pid: int) -> None:
        self.pids.setdefault(group, []).append(pid)
        if self.dir is None:
            return
        path = self.dir / group
        path.mkdir(exist_ok=True)
        with contextlib.suppress(OSError):  # gone already: nothing to count
            (path / "cgroup.procs").write_text(f"{pid}\n")

    def _usage(self, group: str) -> float:
        assert self.dir is not None
        path = self.dir / group
        if self.kind == "v1":
            return int((path / "cpuacct.usage").read_text()) / 1e9
        for line in (path / "cpu.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) / 1e6
        return 0.0

    def sample(self) -> None:
        """psutil fallback only: remember each root's tree, so a stopped one still counts."""
        if self.dir is not None:
            return
        for pids in self.pids.values():
            for pid in pids:
                cpu = tree_cpu(pid)
                if cpu > 0:
                    self._last[pid] = max(cpu, self._last.get(pid, 0.0))

    def read(self) -> dict[str, float]:
        if self.dir is not None:
            return {g: self._usage(g) for g in self.pids}
        self.sample()
        return {g: sum(self._last.get(p, 0.0) for p in pids) for g, pids in self.pids.items()}

    def close(self) -> None:
        """Remove our cgroups (a process still in one goes back to the root first)."""
        if self.dir is None:
            return
        root = self.dir.parent
        for group in self.pids:
            path = self.dir / group
            with contextlib.suppress(OSError):
                for pid in (path / "cgroup.procs").read_text().split():
                    with contextlib.suppress(OSError):
                        (root / "cgroup.procs").write_text(f"{pid}\n")
                path.rmdir()
        with contextlib.suppress(OSError):
            self.dir.rmdir()


class ConmonSampler:
    """conmon processes whose command line names one of our job ids (the container's name
    holds it): the latest own + reaped children's times of each, seconds. A lower bound:
    what a conmon spends after its last sample is not seen."""

    def __init__(self) -> None:
        self.seen: dict[int, float] = {}

    def sample(self, job_ids: set[str]) -> None:
        for p in psutil.process_iter(["name"]):
            if p.info["name"] != "conmon":
                continue
            with contextlib.suppress(psutil.Error):
                if p.pid not in self.seen:
                    line = " ".join(p.cmdline())
                    if not any(j in line for j in job_ids):
                        continue
                t = p.cpu_times()
                self.seen[p.pid] = t.user + t.system + t.children_user + t.children_system

    def total(self) -> float:
        return sum(self.seen.values())
