"""A crun worker's launch against the real kernel, without crun: the supervisor's command
joins the cgroups the agent made before it runs (cgroupv1.py, supervise.py), and on a
hybrid host the command sees the cgroup2 mount covered while the host keeps it. Skipped
where the agent would not use crun's path (not root, no cgroup v1 controllers)."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest
from gpufleet_node_agent.runtimes import cgroupv1
from gpufleet_node_agent.runtimes.cgroupv1 import Cgroups, Limits
from gpufleet_node_agent.runtimes.supervise import supervisor_argv

FOUND, WHY = Cgroups.here()
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or FOUND is None, reason=f"needs root and cgroup v1: {WHY}"
)


def supervised(tmp_path: Path, procs: list[Path], command: list[str]) -> tuple[str, str]:
    worker = tmp_path / "w"
    worker.mkdir()
    with (worker / "log").open("ab") as log:
        subprocess.run(
            supervisor_argv(worker, command, procs),
            stdout=log,
            check=False,
            start_new_session=True,
            timeout=30,
        )
    return (worker / "exit").read_text().strip(), (worker / "log").read_text()


def test_the_command_runs_in_every_cgroup_made_for_it(tmp_path: Path) -> None:
    assert FOUND is not None
    name = f"test-{uuid.uuid4().hex[:12]}"
    limits = Limits(memory_bytes=2**28, cpu_quota_us=50_000, cpu_period_us=100_000, pids=64)
    procs = FOUND.make(name, limits)
    try:
        code, log = supervised(tmp_path, procs, ["cat", "/proc/self/cgroup"])
    finally:
        FOUND.kill(name)
        assert FOUND.remove(name)
    assert code == "0", log
    joined = {}
    for line in log.splitlines():
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(","):
            joined[c] = path
    for controller in cgroupv1.CONTROLLERS:
        assert joined[controller] == f"/{cgroupv1.PARENT}/{name}", (controller, log)


@pytest.mark.skipif(FOUND is None or not FOUND.hybrid, reason="not a hybrid host")
def test_on_a_hybrid_host_the_runtime_sees_no_cgroup2_mount_and_the_host_keeps_it() -> None:
    def fs_type(prefix: list[str]) -> str:
        argv = [*prefix, "stat", "-f", "-c", "%T", str(cgroupv1.UNIFIED)]
        return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()

    assert fs_type([]) == "cgroup2fs"
    assert fs_type(cgroupv1.hide_unified()) == "proc"
    assert fs_type([]) == "cgroup2fs"  # the host's mount untouched
