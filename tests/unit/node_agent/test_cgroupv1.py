"""Node agent: a crun container's own cgroups (cgroupv1.py), on plain directories: which
hierarchies, what is written, the supervisor joining them. The real thing (crun in them, an
OOM counted) is tests/integration/node_agent/test_podman_runtime.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from gpufleet_node_agent.runtimes import cgroupv1
from gpufleet_node_agent.runtimes.cgroupv1 import Cgroups, Limits
from gpufleet_node_agent.runtimes.supervise import CANNOT_JOIN, supervisor_argv

pytestmark = pytest.mark.unit

HYBRID = """\
25 30 0:23 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
26 25 0:24 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw
27 25 0:25 / /sys/fs/cgroup/systemd rw shared:11 - cgroup cgroup rw,xattr,name=systemd
28 25 0:26 / /sys/fs/cgroup/cpu,cpuacct rw shared:12 - cgroup cgroup rw,cpu,cpuacct
29 25 0:27 / /sys/fs/cgroup/memory rw shared:13 - cgroup cgroup rw,memory
30 25 0:28 / /sys/fs/cgroup/pids rw shared:14 - cgroup cgroup rw,pids
31 25 0:29 / /sys/fs/cgroup/devices rw shared:15 - cgroup cgroup rw,devices
32 30 0:5 / /proc rw,nosuid,nodev,noexec,relatime shared:2 - proc proc rw
"""
V2 = "24 30 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw\n"


def test_the_hierarchies_of_a_hybrid_host_are_found_with_its_v2_mount() -> None:
    found, v2 = cgroupv1.mounts(HYBRID)
    root = Path("/sys/fs/cgroup")
    assert found == {
        "cpu": root / "cpu,cpuacct",
        "cpuacct": root / "cpu,cpuacct",
        "memory": root / "memory",
        "pids": root / "pids",
        "devices": root / "devices",
    }
    assert v2 is True
    assert cgroupv1.problem(found) is None
    # cpu and cpuacct mounted together: one directory for both
    assert Cgroups(found, hybrid=True).dirs("c1") == [
        root / "memory/gpufleet/c1",
        root / "cpu,cpuacct/gpufleet/c1",
        root / "pids/gpufleet/c1",
        root / "devices/gpufleet/c1",
    ]


def test_a_v2_host_or_a_missing_controller_is_said_why() -> None:
    found, v2 = cgroupv1.mounts(V2)
    assert (found, v2) == ({}, True)
    assert "cgroup v2 host" in str(cgroupv1.problem(found))
    no_pids = HYBRID.replace("rw,pids", "rw,freezer")
    assert cgroupv1.problem(cgroupv1.mounts(no_pids)[0]) == "cgroup v1 controllers missing: pids"


def fake_hierarchies(tmp_path: Path) -> Cgroups:
    found = {c: tmp_path / c for c in ("memory", "pids", "devices")}
    found["cpu"] = found["cpuacct"] = tmp_path / "cpu,cpuacct"
    return Cgroups(found, hybrid=False)


def test_a_containers_cgroups_get_runcs_limits_and_device_list(tmp_path: Path) -> None:
    cgroups = fake_hierarchies(tmp_path)
    memsw = tmp_path / "memory/gpufleet/c1/memory.memsw.limit_in_bytes"
    memsw.parent.mkdir(parents=True)
    memsw.write_text("")  # this host counts swap: its limit is written too
    limits = Limits(2**28, 150_000, 100_000, 64, devices=[(195, 1), (195, 255)])
    procs = cgroups.make("c1", limits)
    assert procs == [d / "cgroup.procs" for d in cgroups.dirs("c1")]

    def read(rel: str) -> str:
        return (tmp_path / rel).read_text()

    assert read("memory/gpufleet/c1/memory.limit_in_bytes") == str(2**28)
    assert memsw.read_text() == str(2**28)
    assert read("cpu,cpuacct/gpufleet/c1/cpu.cfs_quota_us") == "150000"
    assert read("cpu,cpuacct/gpufleet/c1/cpu.cfs_period_us") == "100000"
    assert read("pids/gpufleet/c1/pids.max") == "64"
    assert read("devices/gpufleet/c1/devices.deny") == "a"
    # a plain file keeps the last write: the real one appends each rule; the last is its GPU
    assert read("devices/gpufleet/c1/devices.allow") == "c 195:255 rwm"
    assert "c 195:1 rwm" not in cgroupv1.DEFAULT_DEVICES  # no GPU unless given


def test_the_oom_count_is_read_from_its_memory_cgroup(tmp_path: Path) -> None:
    cgroups = fake_hierarchies(tmp_path)
    control = tmp_path / "memory/gpufleet/c1/memory.oom_control"
    assert cgroups.oom_killed("c1") is False  # none (or gone)
    control.parent.mkdir(parents=True)
    control.write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
    assert cgroups.oom_killed("c1") is False
    control.write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    assert cgroups.oom_killed("c1") is True


def test_removal_says_whether_its_cgroups_are_gone(tmp_path: Path) -> None:
    cgroups = fake_hierarchies(tmp_path)
    for d in cgroups.dirs("c1"):
        d.mkdir(parents=True)
    (cgroups.dirs("c1")[0] / "busy").write_text("")  # a directory rmdir cannot take
    assert cgroups.remove("c1", wait_s=0.05) is False
    assert [d.exists() for d in cgroups.dirs("c1")] == [True, False, False, False]
    (cgroups.dirs("c1")[0] / "busy").unlink()
    assert cgroups.remove("c1") is True
    assert cgroups.remove("c1") is True  # gone already


def _supervise(tmp_path: Path, procs: list[Path], command: list[str]) -> str:
    """Run the joining supervisor (supervise.py) as the agent starts it; the `exit` it wrote."""
    worker = tmp_path / "w"
    worker.mkdir(exist_ok=True)
    subprocess.run(
        supervisor_argv(worker, command, procs),
        stdout=(worker / "log").open("ab"),
        check=False,
        start_new_session=True,
    )
    return (worker / "exit").read_text().strip()


def test_the_supervisor_joins_each_cgroup_itself_then_execs_the_runtime(
    tmp_path: Path,
) -> None:
    """ "0" in cgroup.procs moves the writing process: the command's own (no `$$` in a
    subshell); the cgroups are joined before the command runs (tests/integration:
    test_crun_cgroups, with real ones)."""
    procs = [tmp_path / "a.procs", tmp_path / "b.procs"]
    seen = tmp_path / "seen"
    command = ["sh", "-c", f"cat {procs[0]} {procs[1]} > {seen}"]
    assert _supervise(tmp_path, procs, command) == "0"
    assert [p.read_text() for p in procs] == ["0\n", "0\n"]
    assert seen.read_text() == "0\n0\n"  # written before it ran


def test_the_supervisor_stops_before_the_runtime_when_it_cannot_join(tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    missing = tmp_path / "none/cgroup.procs"
    assert _supervise(tmp_path, [missing], ["touch", str(ran)]) == str(CANNOT_JOIN)
    assert not ran.exists()
    assert "none/cgroup.procs" in (tmp_path / "w" / "log").read_text()  # why, in its log


def test_crun_runs_where_the_v2_mount_is_covered_by_a_proc_mount_of_its_own() -> None:
    argv = cgroupv1.hide_unified()
    assert argv[:4] == ["unshare", "--mount", "--propagation", "private"]
    assert argv[4] == "--mount-proc=/sys/fs/cgroup/unified"
