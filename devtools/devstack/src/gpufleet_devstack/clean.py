"""`just clean`: remove the run directory of `just up` (GPUFLEET_RUN_DIR, default `.run`):
NATS's and the database's data, logs, the local registry's images, the node's workers.

It refuses while anything still runs on that directory (a `just up`, or a worker it left),
and unmounts what a crashed run left mounted in it (workers' disks) before removing it, so
that it never deletes into a mounted filesystem nor from under a running server.

    uv run python -m gpufleet_devstack.clean
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from gpufleet_devstack.config import run_dir_from_env
from gpufleet_devstack.console import make_out, rel


def users_of(run_dir: Path) -> list[int]:
    """Processes whose command line names a path inside `run_dir` (its servers, the node
    agent's worker supervisors)."""
    inside = str(run_dir)
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a == inside.encode() or a.startswith(inside.encode() + b"/") for a in args):
            found.append(int(entry.name))
    return sorted(found)


def mounts_in(run_dir: Path) -> list[Path]:
    """Mount points inside `run_dir`, deepest first (/proc/self/mountinfo's 5th field)."""
    points = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        fields = line.split(" ")
        if len(fields) > 4:
            point = Path(fields[4].encode().decode("unicode_escape"))
            if point == run_dir or run_dir in point.parents:
                points.append(point)
    return sorted(points, key=lambda p: len(p.parts), reverse=True)


def clean(run_dir: Path) -> int:
    out = make_out()
    if not run_dir.exists():
        out.ok(f"nothing to remove: {rel(run_dir)} does not exist")
        return 0
    busy = users_of(run_dir)
    if busy:
        out.error(
            f"{rel(run_dir)} is in use by {len(busy)} process(es) (pids "
            f"{', '.join(map(str, busy[:8]))}): stop `just up` first (Ctrl-C)"
        )
        return 1
    for point in mounts_in(run_dir):
        out.step(f"unmounting {rel(point)} (left mounted by an earlier run)")
        done = subprocess.run(["umount", str(point)], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            out.error(f"cannot unmount {rel(point)}: {done.stderr.strip()}")
            return 1
    shutil.rmtree(run_dir)
    out.ok(f"removed {rel(run_dir)}")
    return 0


def main() -> None:
    sys.exit(clean(run_dir_from_env()))


if __name__ == "__main__":
    main()
