"""What a container worker's disk quota (disk.py) costs: setup and release, N times.

    sudo uv run python benchmarks/node_agent/disk_cost.py [N]   # 40 by default; root: mounts

CPU of this process (`own`) and of the processes it ran and waited for (`children`: mkfs,
mount, cp, umount), and wall time, per worker, for a 10 GB disk under /var/tmp. Two ways
in the same run: `disk.setup` (a sparse copy of the node's template, formatted once) and,
as the baseline, what it did before: a `mkfs.ext4` of each worker's file, then the same
mount. Kernel threads (the loop device's) are in neither.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpufleet_node_agent.steps import disk


def cpu() -> tuple[float, float]:
    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime, c.ru_utime + c.ru_stime


def show(name: str, n: int, a: tuple[float, float, float], b: tuple[float, float, float]) -> None:
    own, children, wall = ((y - x) * 1000 / n for x, y in zip(a, b, strict=True))
    print(f"{name}: own {own:.1f} children {children:.1f} wall {wall:.1f} ms per worker")


def mkfs_setup(d: Path) -> None:
    """The baseline: the worker's own file formatted (mkfs per worker), then mounted."""
    image, mountpoint = d / disk.IMAGE, d / disk.MOUNTPOINT
    mountpoint.mkdir()
    with image.open("wb") as f:
        f.truncate(disk.size_bytes(10))
    for argv in (disk.mkfs_argv(image), disk.mount_argv(image, mountpoint)):
        subprocess.run(argv, check=True, capture_output=True)
    shutil.rmtree(mountpoint / "lost+found")
    for q in disk.QUOTA_DIRS:
        (mountpoint / q.name).mkdir()
        os.chown(mountpoint / q.name, 10000, 10000)


def measure(name: str, root: Path, n: int, setup: object) -> None:
    dirs = [root / "workers" / f"{name}-{i}" for i in range(n)]
    t0 = (*cpu(), time.monotonic())
    for d in dirs:
        d.mkdir(parents=True)
        if setup is None:
            error = disk.setup(d, 10, 10000)
            assert error is None, error
        else:
            mkfs_setup(d)
    t1 = (*cpu(), time.monotonic())
    for d in dirs:
        disk.release(d)
    t2 = (*cpu(), time.monotonic())
    show(f"{name} setup", n, t0, t1)
    show(f"{name} release", n, t1, t2)
    for d in dirs:
        shutil.rmtree(d)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    root = Path(tempfile.mkdtemp(prefix="disk-cost-", dir="/var/tmp"))
    try:
        made = disk.template(root / disk.TEMPLATES, 10)  # once per node: not in the figures
        assert isinstance(made, Path), made
        for _ in range(2):  # interleaved, twice: the machine's drift falls on both
            measure("mkfs per worker (before)", root, n, mkfs_setup)
            measure("copy of the template", root, n, None)
    finally:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
