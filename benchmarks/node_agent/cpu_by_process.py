"""CPU by process, machine-wide, while a command runs: BSD process accounting (acct(2)).

    sudo uv run python benchmarks/node_agent/cpu_by_process.py [--per N] [--json F] -- CMD...

Switches the kernel's process accounting on into a temporary file, runs CMD, switches it
off, and sums the user+system CPU of every process that *ended* meanwhile by its command
name (the last exec'd, 15 characters), with a few names split by their parent: `podman`
started by conmon is `podman container cleanup`, by anyone else a CLI call (`podman run`,
`ps`, `rm`). `--per N` divides by N (jobs). Needs root (acct(2)); one accounting file per
machine, so nothing else may use it meanwhile. Processes still running at the end (the
benchmark itself, nats-server) are not counted: the benchmark reports its own CPU.
Everything on the machine counts, other users' processes too (their names show it).
The kernel records each process's time in whole 1/100 s, rounded down: short processes
(mkfs, mount, many runc calls) read low or zero, so the names' figures are lower bounds.

Exact figures beside them (cgroup v1 cpuacct, nanoseconds, charged up the hierarchy so a
removed container's time stays in its parent's): CMD and everything it starts that stays in
its cgroup (the agent, its podman CLI calls, mkfs/mount/cp), and podman's own cgroups:
`libpod_parent/conmon` (conmon, and the `runc` and `podman container cleanup` it runs) and
`libpod_parent` (that plus the containers: runc's init, catatonit, the command). Any other
user's podman containers on the machine count there too.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import struct
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

# struct acct_v3 (linux/acct.h): flag, version, tty, exitcode, uid, gid, pid, ppid, btime,
# etime (float), utime, stime, mem, io, rw, minflt, majflt, swaps (comp_t), comm[16]
RECORD = struct.Struct("<BBHIIIIIIf8H16s")
AHZ = 100  # comp_t times are in 1/AHZ s
CPUACCT = Path("/sys/fs/cgroup/cpuacct")
PODMAN_GROUPS = ("libpod_parent/conmon", "libpod_parent")


def usage_s(group: Path) -> float | None:
    try:
        return int((group / "cpuacct.usage").read_text()) / 1e9
    except (OSError, ValueError):
        return None


def comp_t(v: int) -> int:
    """13-bit mantissa, 3-bit base-8 exponent."""
    return (v & 0x1FFF) << (3 * (v >> 13))


def parse(data: bytes) -> list[dict[str, Any]]:
    out = []
    for off in range(0, len(data) - RECORD.size + 1, RECORD.size):
        f = RECORD.unpack_from(data, off)
        if f[1] != 3:  # not v3: give up rather than misread
            raise SystemExit(f"acct record version {f[1]}, expected 3")
        out.append(
            {
                "pid": f[6],
                "ppid": f[7],
                "cpu_s": (comp_t(f[10]) + comp_t(f[11])) / AHZ,
                "comm": f[18].split(b"\0", 1)[0].decode(errors="replace"),
            }
        )
    return out


def group(records: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    by_pid = {r["pid"]: r["comm"] for r in records}
    sums: dict[str, dict[str, float]] = defaultdict(lambda: {"cpu_s": 0.0, "count": 0})
    for r in records:
        name = r["comm"]
        if name == "podman":
            name = "podman cleanup" if by_pid.get(r["ppid"]) == "conmon" else "podman CLI"
        sums[name]["cpu_s"] += r["cpu_s"]
        sums[name]["count"] += 1
    return dict(sums)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per", type=int, default=1, help="divide by this (e.g. jobs)")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    libc = ctypes.CDLL(None, use_errno=True)
    with tempfile.TemporaryDirectory(prefix="cpu-by-process-") as tmp:
        path = Path(tmp) / "acct"
        path.touch()
        if libc.acct(str(path).encode()) != 0:
            raise SystemExit(f"acct(2): {os.strerror(ctypes.get_errno())}")
        own = CPUACCT / f"cpu-by-process-{os.getpid()}"
        own.mkdir(exist_ok=True)
        podman0 = {g: usage_s(CPUACCT / g) for g in PODMAN_GROUPS}

        def join() -> None:  # the command, in its own cgroup from its start
            (own / "cgroup.procs").write_text(str(os.getpid()))

        try:
            rc = subprocess.call(cmd, preexec_fn=join) if cmd else 0
        finally:
            libc.acct(None)
        exact = {"command's cgroup": usage_s(own)}
        for g in PODMAN_GROUPS:
            now, before = usage_s(CPUACCT / g), podman0[g]
            exact[g] = None if now is None or before is None else now - before
        with contextlib.suppress(OSError):
            own.rmdir()
        sums = group(parse(path.read_bytes()))
    total = sum(s["cpu_s"] for s in sums.values())
    rows = sorted(sums.items(), key=lambda kv: -kv[1]["cpu_s"])
    print(f"{'process':<18}{'count':>8}{'CPU s':>10}{'ms per':>10}", file=sys.stderr)
    for name, s in rows[: args.top]:
        per = 1000 * s["cpu_s"] / args.per
        print(f"{name:<18}{s['count']:>8}{s['cpu_s']:>10.2f}{per:>10.1f}", file=sys.stderr)
    print(
        f"{'all ended':<18}{'':>8}{total:>10.2f}{1000 * total / args.per:>10.1f}", file=sys.stderr
    )
    for name, v in exact.items():
        if v is not None:
            print(f"cgroup {name:<30}{v:>10.2f}{1000 * v / args.per:>10.1f}", file=sys.stderr)
    if args.json is not None:
        result = {"per": args.per, "total_cpu_s": total, "by_process": sums, "cgroups_cpu_s": exact}
        args.json.write_text(json.dumps(result, indent=1))
    return rc


if __name__ == "__main__":
    sys.exit(main())
