"""What a container worker's disk quota (disk.py) costs: setup and release, N times.

    sudo uv run python benchmarks/node_agent/disk_cost.py [N]   # 40 by default; root: mounts

CPU of this process (`own`) and of the processes it ran and waited for (`children`: mkfs,
mount, cp, umount), and wall time, per worker, for a 10 GB disk under /var/tmp.
Kernel threads (the loop device's) are in neither.
"""

from __future__ import annotations

import resource
import sys
import tempfile
import time
from pathlib import Path

from gpufleet_node_agent import disk


def cpu() -> tuple[float, float]:
    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime, c.ru_utime + c.ru_stime


def show(name: str, n: int, a: tuple[float, float, float], b: tuple[float, float, float]) -> None:
    own, children, wall = ((y - x) * 1000 / n for x, y in zip(a, b, strict=True))
    print(f"{name}: own {own:.1f} children {children:.1f} wall {wall:.1f} ms per worker")


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    root = Path(tempfile.mkdtemp(prefix="disk-cost-", dir="/var/tmp"))
    dirs = [root / f"w{i}" for i in range(n)]
    t0 = (*cpu(), time.monotonic())
    for d in dirs:
        d.mkdir()
        error = disk.setup(d, 10, 10000)
        assert error is None, error
    t1 = (*cpu(), time.monotonic())
    for d in dirs:
        disk.release(d)
    t2 = (*cpu(), time.monotonic())
    show("setup", n, t0, t1)
    show("release", n, t1, t2)
    for d in dirs:
        d.rmdir()
    root.rmdir()


if __name__ == "__main__":
    main()
