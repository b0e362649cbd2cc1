"""A worker's container as an OCI runtime config (runc's config.json), as plain data.

The same container `podman_args.container_spec` describes and `podman run` would make
(services/node-agent/README.md, "Launching containers"): the image's root read-only, the
worker's binds, uid 10000, no capabilities, no new privileges, podman's seccomp profile,
its own pid, network (loopback only), IPC, UTS and mount namespaces, memory (swap
included), CPU and pids limits, only its own GPUs' device nodes, catatonit as PID 1. No I/O
here but reading a device node's numbers (runc.py runs it).
"""

from __future__ import annotations

import os
import platform
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .podman_args import ContainerSpec

INIT_TARGET = "/run/gpufleet-init"  # catatonit, bound read-only (podman: /run/podman-init)
CGROUP_PARENT = "gpufleet"
HOSTNAME = "gpufleet-worker"  # every worker's; /etc/hosts of the node's rootfs names it
CPU_PERIOD_US = 100_000
RWM = "rwm"

# runc's and podman's defaults: what of /proc and /sys a container must not read or write
MASKED_PATHS = (
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/fs/selinux",
    "/sys/dev/block",
)
READONLY_PATHS = (
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
)
# Go's names (containers' seccomp.json says `arches` in them) of this machine's architecture
GO_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "ppc64le": "ppc64le", "s390x": "s390x"}
SCMP_ARCH = {  # and libseccomp's, as the profile's archMap names them
    "amd64": "SCMP_ARCH_X86_64",
    "arm64": "SCMP_ARCH_AARCH64",
    "ppc64le": "SCMP_ARCH_PPC64LE",
    "s390x": "SCMP_ARCH_S390X",
}


@dataclass(frozen=True)
class Device:
    """A character device node the container gets (a GPU's), and may use."""

    path: str
    major: int
    minor: int


def device_nodes(paths: Sequence[str]) -> list[Device] | None:
    """The device nodes at `paths`; None if one is not a host path of a character device
    (a CDI name, say: podman resolves those, runc cannot)."""
    out = []
    for p in paths:
        if not p.startswith("/"):
            return None
        try:
            st = os.stat(p)
        except OSError:
            return None
        if not stat.S_ISCHR(st.st_mode):
            return None
        out.append(Device(p, os.major(st.st_rdev), os.minor(st.st_rdev)))
    return out


def seccomp(profile: Mapping[str, Any], machine: str | None = None) -> dict[str, Any]:
    """containers' seccomp.json (the profile podman applies) as an OCI `linux.seccomp`, for
    a process with no capabilities on this machine's architecture, as podman builds it:
    rules that need a capability are left out, rules excluded for a capability kept.

    One difference: the filter is for the machine's own architecture only, not also its
    32-bit ones (x86 and x32 beside x86_64) that podman lists. A 32-bit system call (`int
    0x80`, say) is then killed (SIGSYS) instead of allowed, and the runtime compiles a
    third of the filter: it was most of the CPU crun spends on a container (node agent
    README, "Launching containers")."""
    arch = GO_ARCH.get(machine or platform.machine(), machine or platform.machine())
    architectures: list[str] = []
    for entry in profile.get("archMap") or []:
        if entry.get("architecture") == SCMP_ARCH.get(arch):
            architectures = [entry["architecture"]]
    rules = []
    for s in profile.get("syscalls") or []:
        inc, exc = s.get("includes") or {}, s.get("excludes") or {}
        if inc.get("caps") or inc.get("minKernel"):
            continue  # needs a capability (or a kernel check): not for a worker
        if inc.get("arches") and arch not in inc["arches"]:
            continue
        if exc.get("arches") and arch in exc["arches"]:
            continue
        rule: dict[str, Any] = {"names": list(s["names"]), "action": s["action"]}
        if s.get("errnoRet") is not None:
            rule["errnoRet"] = s["errnoRet"]
        if s.get("args"):
            rule["args"] = [
                {k: a[k] for k in ("index", "value", "valueTwo", "op") if k in a} for a in s["args"]
            ]
        rules.append(rule)
    out: dict[str, Any] = {"defaultAction": profile["defaultAction"], "syscalls": rules}
    if profile.get("defaultErrnoRet") is not None:
        out["defaultErrnoRet"] = profile["defaultErrnoRet"]
    if architectures:
        out["architectures"] = architectures
    return out


def _bind(source: Path | str, target: str, read_only: bool) -> dict[str, Any]:
    options = ["rbind", "nosuid", "nodev", "ro" if read_only else "rw"]
    return {"destination": target, "type": "bind", "source": str(source), "options": options}


def _tmpfs(target: str, options: Sequence[str]) -> dict[str, Any]:
    return {"destination": target, "type": "tmpfs", "source": "tmpfs", "options": list(options)}


def mounts(c: ContainerSpec, init: Path) -> list[dict[str, Any]]:
    """The container's mounts, in order (a bind under another comes after it: MPS pipes in
    /tmp, keys in /run)."""
    out = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        _tmpfs("/dev", ["nosuid", "strictatime", "mode=755", "size=65536k"]),
        {
            "destination": "/dev/pts",
            "type": "devpts",
            "source": "devpts",
            "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"],
        },
        _tmpfs("/dev/shm", ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]),
        {
            "destination": "/dev/mqueue",
            "type": "mqueue",
            "source": "mqueue",
            "options": ["nosuid", "noexec", "nodev"],
        },
        {
            "destination": "/sys",
            "type": "sysfs",
            "source": "sysfs",
            "options": ["nosuid", "noexec", "nodev", "ro"],
        },
        {  # its own cgroups only, read-only (on cgroup v1: binds of its own subtrees)
            "destination": "/sys/fs/cgroup",
            "type": "cgroup",
            "source": "cgroup",
            "options": ["nosuid", "noexec", "nodev", "relatime", "ro"],
        },
        # podman's --read-only: /run a small tmpfs of its own (and /tmp, /var/tmp below)
        _tmpfs("/run", ["nosuid", "nodev", "mode=755", "size=65536k"]),
        _bind(init, INIT_TARGET, True),
    ]
    # /tmp and /var/tmp: the disk quota's binds (runc starts only containers with one)
    out += [_bind(b.host, b.target, b.read_only) for b in c.binds]
    return out


def oci_config(
    c: ContainerSpec,
    rootfs: Path,
    *,
    init: Path,
    image_env: Mapping[str, str] | None = None,
    entrypoint: Sequence[str] = (),
    devices: Sequence[Device] = (),
    seccomp_profile: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """config.json of `c` on the prepared root `rootfs` (runc.py): the image's env under
    the container's, the image's entrypoint before the command, as `podman run`."""
    uid, _, gid = c.user.partition(":")
    env = {**(image_env or {}), **c.env}
    linux: dict[str, Any] = {
        "namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")],
        "devices": [
            {"path": d.path, "type": "c", "major": d.major, "minor": d.minor, "fileMode": 0o666}
            for d in devices
        ],
        "resources": {
            "devices": [
                {"allow": False, "access": RWM},
                *(
                    {
                        "allow": True,
                        "type": "c",
                        "major": d.major,
                        "minor": d.minor,
                        "access": "rwm",
                    }
                    for d in devices
                ),
            ],
            "memory": {"limit": c.memory_mb * 2**20, "swap": c.memory_mb * 2**20},
            "cpu": {"quota": int(c.cpus * CPU_PERIOD_US), "period": CPU_PERIOD_US},
            "pids": {"limit": c.pids},
        },
        "cgroupsPath": f"/{CGROUP_PARENT}/{c.name}",
        "maskedPaths": list(MASKED_PATHS),
        "readonlyPaths": list(READONLY_PATHS),
    }
    if seccomp_profile is not None:
        linux["seccomp"] = dict(seccomp_profile)
    if c.sysctls:
        linux["sysctl"] = dict(c.sysctls)
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": int(uid), "gid": int(gid or uid)},
            "args": [INIT_TARGET, "--", *entrypoint, *c.command],
            "env": [f"{k}={v}" for k, v in env.items()],
            "cwd": c.workdir,
            "capabilities": {
                "bounding": [],
                "effective": [],
                "inheritable": [],
                "permitted": [],
                "ambient": [],
            },
            "noNewPrivileges": True,
        },
        "root": {"path": str(rootfs), "readonly": c.read_only},
        "hostname": HOSTNAME,
        "mounts": mounts(c, init),
        "annotations": dict(c.labels),
        "linux": linux,
    }
