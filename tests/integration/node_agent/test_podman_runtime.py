"""The podman worker runtime against real podman: isolation, limits, stop, restart.

Skipped only where podman is not installed (`just setup` installs it). The first run builds
the base image from Debian packages (about a minute); later runs find it in podman's store.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from gpufleet_contracts.jobs import Mount, MountKind, StartWorker, WorkerFinished, WorkerState
from gpufleet_node_agent.baseimage import (
    podman_env,
)
from gpufleet_node_agent.runtimes.podman import PodmanRuntime
from gpufleet_node_agent.runtimes.podman_args import PodmanConfig, container_name
from gpufleet_node_agent.runtimes.runc import BUNDLES
from gpufleet_node_agent.runtimes.runc import DEFAULT_ROOT as runc_root
from gpufleet_node_agent.worker.manager import WorkerManager

from .podman_support import CONF, Broker, until_finished, until_started

pytestmark = pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed")


def manager(state: Path, minion: str, image: str, **config: Any) -> WorkerManager:
    settings: dict[str, Any] = {"memory_mb": 256, "cpus": 1, "stop_grace_s": 2, **config}
    runtime = PodmanRuntime(PodmanConfig(image=image, containers_conf=CONF, **settings), minion)
    runtime.node_gpus = 2
    return WorkerManager(state, minion, Broker(), gpu_indices=[0, 1], runtime=runtime)  # type: ignore[arg-type]


def start(minion: str, code: str, placement: str | None = None, **kw: Any) -> StartWorker:
    placement = placement or uuid.uuid4().hex
    fields: dict[str, Any] = {
        "minion_id": minion,
        "job_id": f"job-{placement[:6]}",
        "job_name": "it",
        "worker": 0,
        "command": ["python3", "-c", code],
        "gpu_indices": [1],
        "placement_id": placement,
        **kw,
    }
    return StartWorker(**fields)


PROBE = """
import json, os, socket
def readable(p):
    try:
        open(p).read(); return True
    except OSError:
        return False
def writable(p):
    try:
        open(p, 'w').write('x'); return True
    except OSError:
        return False
def connects(port):
    s = socket.socket(); s.settimeout(1)
    try:
        s.connect(('127.0.0.1', port)); return True
    except OSError:
        return False
print(json.dumps({
    'uid': os.getuid(), 'gid': os.getgid(), 'cwd': os.getcwd(),
    'host_secret': readable(%(secret)r), 'state_dir': os.path.exists(%(state)r),
    'other_worker': os.path.exists(%(other)r), 'etc_shadow': readable('/etc/shadow'),
    'token': os.environ.get('API_TOKEN'), 'path': os.environ.get('PATH'),
    'ml_output': os.environ.get('ML_OUTPUT_PATH'), 'data': os.environ.get('ML_DATA_PATH'),
    'cuda': os.environ.get('CUDA_VISIBLE_DEVICES'), 'job_id': os.environ.get('JOB_ID'),
    'output_writable': writable('/opt/ml/output/out.txt'),
    'input_writable': writable('/opt/ml/input/x'), 'nats': connects(4222),
    'ml': sorted(os.listdir('/opt/ml')),
    'root_writable': writable('/etc/gpufleet-probe'),
    'confined': {k: v.strip() for k, v in (l.split(':', 1) for l in open('/proc/self/status'))
                 if k in ('CapEff', 'CapPrm', 'CapBnd', 'NoNewPrivs', 'Seccomp')},
    'pid1': open('/proc/1/cmdline').read().split(chr(0))[0],
}))
"""


@pytest.mark.parametrize("launcher", ["crun", "runc", "podman"])
async def test_a_worker_is_isolated_and_gets_its_env(
    tmp_path: Path, minion: str, image: str, launcher: str
) -> None:
    """The same container whoever starts it (runc.py or `podman run`)."""
    state = tmp_path / "state"
    secret = tmp_path / "host-secret.txt"
    secret.write_text("the host's")
    (state).mkdir()
    (state / "node.creds").write_text("the node's credential")
    m = manager(state, minion, image, launcher=launcher)
    other = start(minion, "import time; time.sleep(30)")
    assert m.start(other)
    code = PROBE % {
        "secret": str(secret),
        "state": str(state),
        "other": str(m.worker_dir(other.placement_id)),
    }
    mounts = [
        Mount(
            target="/opt/ml/input/data",
            kind=MountKind.dataset,
            source=None,  # a directory nothing fills (a node fetches no dataset yet)
            env="ML_DATA_PATH",
        )
    ]
    cmd = start(
        minion,
        code,
        env={"API_TOKEN": "line one\nline two", "PATH": "/usr/bin:/bin"},
        mounts=mounts,
    )
    assert m.start(cmd)
    t0 = time.monotonic()
    done = await until_finished(m, cmd.placement_id)
    print(f"container job end to end: {time.monotonic() - t0:.2f}s")
    assert (done.state, done.exit_code) == (WorkerState.finished, 0), done.log_tail
    seen = json.loads(done.log_tail)
    assert seen == {
        "uid": 10000,
        "gid": 10000,
        "cwd": "/opt/ml/output",
        "host_secret": False,
        "state_dir": False,
        "other_worker": False,
        "etc_shadow": False,
        "token": "line one\nline two",
        "path": "/usr/bin:/bin",
        "ml_output": "/opt/ml/output",
        "data": "/opt/ml/input/data",
        "cuda": "1",  # simulated GPUs: the placement's indices, as the bare runtime gives
        "job_id": cmd.job_id,
        "output_writable": True,
        "input_writable": False,
        "nats": False,
        "ml": ["checkpoint", "input", "models", "output"],
        "root_writable": False,
        "confined": {  # no capability at all, no new privileges, a seccomp filter
            "CapEff": "0000000000000000",
            "CapPrm": "0000000000000000",
            "CapBnd": "0000000000000000",
            "NoNewPrivs": "1",
            "Seccomp": "2",
        },
        "pid1": "/run/podman-init" if launcher == "podman" else "/run/gpufleet-init",
    }
    wd = m.worker_dir(cmd.placement_id)
    assert (wd / "output" / "out.txt").read_text() == "x"
    assert (wd / "output" / "out.txt").stat().st_uid == 10000
    # the env values are nowhere on disk, nor in the stored spec
    assert not (wd / "env.json").exists() and not (wd / "podman.env").exists()
    assert "line one" not in (wd / "spec.json").read_text()
    for f in wd.rglob("*"):
        # (its output, and the log of what the probe printed, are the job's own)
        kept = ("log", "container.log")
        if f.is_file() and f.name not in kept and not f.is_relative_to(wd / "output"):
            assert b"line one" not in f.read_bytes(), f
    assert (wd / "runc.json").exists() is (launcher != "podman")
    # an OCI runtime's bundle (its config.json held the values) was on tmpfs, not in the
    # worker's directory, and is gone with the container; the other one's is there still
    assert not (wd / "bundle").exists()
    assert not (BUNDLES / container_name(cmd.job_id, cmd.worker, cmd.placement_id)).exists()
    other_bundle = BUNDLES / container_name(other.job_id, other.worker, other.placement_id)
    assert other_bundle.is_dir() is (launcher != "podman")
    m.stop(other.job_id, 0, other.placement_id, "test over")
    stopped = await until_finished(m, other.placement_id)
    assert (stopped.state, stopped.reason) == (WorkerState.stopped, "test over")


@pytest.mark.parametrize("launcher", ["crun", "runc", "podman"])
async def test_a_memory_hog_is_reported_out_of_memory(
    tmp_path: Path, minion: str, image: str, launcher: str
) -> None:
    m = manager(tmp_path / "state", minion, image, memory_mb=64, launcher=launcher)
    code = "print('allocating', flush=True); x = bytearray(512 * 2**20); print('survived')"
    cmd = start(minion, code)
    m.start(cmd)
    done = await until_finished(m, cmd.placement_id)
    assert (done.state, done.reason, done.exit_code) == (WorkerState.failed, "out of memory", 137)
    assert done.log_tail == "allocating\n"


GRACEFUL = """
import signal, sys, time
def bye(*_):
    print('got SIGTERM', flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, bye)
print('up', flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("launcher", ["crun", "runc", "podman"])
async def test_a_stop_reaches_the_job_as_sigterm_within_the_grace_period(
    tmp_path: Path, minion: str, image: str, launcher: str
) -> None:
    """The runtime (or catatonit) passes the stop's SIGTERM on: the job can save its work."""
    m = manager(tmp_path / "state", minion, image, launcher=launcher, stop_grace_s=20)
    cmd = start(minion, GRACEFUL)
    m.start(cmd)
    await until_started(m, cmd.placement_id)
    w = m.active[cmd.placement_id]
    for _ in range(100):  # started is said as it starts: wait for the job's own word
        await m.poll_once()  # (podman's log reaches `log` in a round)
        if w.file("log").exists() and b"up" in w.file("log").read_bytes():
            break
        await asyncio.sleep(0.1)
    began = time.monotonic()
    m.stop(cmd.job_id, 0, cmd.placement_id, "test over")
    done = await until_finished(m, cmd.placement_id)
    assert (done.state, done.reason) == (WorkerState.stopped, "test over")
    assert done.log_tail == "up\ngot SIGTERM\n"
    assert time.monotonic() - began < 15  # not the SIGKILL after the grace period


SYSCALL_32 = """
import ctypes, mmap
code = bytes([0xB8, 20, 0, 0, 0, 0xCD, 0x80, 0xC3])  # mov eax, 20 (i386 getpid); int 0x80; ret
buf = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
buf.write(code)
call = ctypes.CFUNCTYPE(ctypes.c_long)(ctypes.addressof(ctypes.c_char.from_buffer(buf)))
print('64-bit calls run', flush=True)
print('32-bit getpid', call(), flush=True)
"""


@pytest.mark.skipif(platform.machine() != "x86_64", reason="an x86 instruction")
@pytest.mark.parametrize("launcher", ["crun", "runc"])
async def test_a_32_bit_system_call_is_killed_by_the_seccomp_filter(
    tmp_path: Path, minion: str, image: str, launcher: str
) -> None:
    """oci.seccomp: the filter is for x86_64 only; a 32-bit call (int 0x80) is killed."""
    m = manager(tmp_path / "state", minion, image, launcher=launcher)
    cmd = start(minion, SYSCALL_32)
    m.start(cmd)
    done = await until_finished(m, cmd.placement_id)
    assert (done.state, done.exit_code) == (WorkerState.failed, 128 + signal.SIGSYS)
    assert done.log_tail == "64-bit calls run\n"


async def test_a_running_container_is_reattached_after_a_restart(
    tmp_path: Path, minion: str, image: str
) -> None:
    state = tmp_path / "state"
    first = manager(state, minion, image)
    cmd = start(minion, "import time; print('begin', flush=True); time.sleep(3); print('end')")
    first.start(cmd)
    await until_started(first, cmd.placement_id)
    assert first.running() == [f"{cmd.job_id}/0"]
    # the agent is gone (its manager dropped), the container is not
    second = manager(state, minion, image)
    found = second.recover()
    assert (found.reattached, found.lost) == ([cmd.placement_id], [])
    done = await until_finished(second, cmd.placement_id)
    assert (done.state, done.exit_code) == (WorkerState.finished, 0)
    assert done.log_tail == "begin\nend\n"
    for _ in range(3):
        await second.poll_once()
    assert len(second.broker.events(WorkerFinished)) == 1  # type: ignore[attr-defined]


async def two_sleepers(m: WorkerManager, minion: str) -> tuple[StartWorker, StartWorker]:
    """Two workers of a minute each, started and running."""
    cmds = (start(minion, "import time; time.sleep(60)") for _ in range(2))
    running, later = cmds
    for cmd in (running, later):
        m.start(cmd)
        await until_started(m, cmd.placement_id)
    return running, later


async def test_a_container_whose_state_is_gone_is_reported_lost(
    tmp_path: Path, minion: str, image: str
) -> None:
    """A container `podman run` started, removed behind the agent's back."""
    state = tmp_path / "state"
    m = manager(state, minion, image, launcher="podman")
    running, later = await two_sleepers(m, minion)
    env = podman_env(CONF)
    # removed behind the agent's back while it runs ...
    await asyncio.to_thread(
        subprocess.run,
        ["podman", "rm", "-f", PodmanRuntime.container_of(m.active[running.placement_id])],
        env=env,
        check=True,
        capture_output=True,
    )
    done = await until_finished(m, running.placement_id)
    assert (done.state, done.reason) == (WorkerState.failed, PodmanRuntime.lost_at_runtime)
    # ... and while it was away
    await asyncio.to_thread(
        subprocess.run,
        ["podman", "rm", "-f", PodmanRuntime.container_of(m.active[later.placement_id])],
        env=env,
        check=True,
        capture_output=True,
    )
    again = manager(state, minion, image, launcher="podman")
    assert again.recover().lost == [later.placement_id]
    gone = await until_finished(again, later.placement_id)
    assert (gone.state, gone.reason) == (WorkerState.failed, PodmanRuntime.lost_at_restart)


def container_there(launcher: str, name: str, cgroup_left: bool = False) -> bool:
    """Is the container still there: runc's state, or the processes in crun's cgroups
    (`cgroup_left`: or its cgroups, empty)?"""
    if launcher == "runc":
        return (
            subprocess.run(
                ["runc", "--root", str(runc_root), "state", name], capture_output=True, check=False
            ).returncode
            == 0
        )
    procs = Path("/sys/fs/cgroup/pids/gpufleet", name, "cgroup.procs")
    if cgroup_left and procs.parent.exists():
        return True
    return procs.exists() and bool(procs.read_text().split())


@pytest.mark.parametrize("launcher", ["crun", "runc"])
async def test_a_container_whose_supervisor_is_killed_is_reported_lost_and_ended(
    tmp_path: Path, minion: str, image: str, launcher: str
) -> None:
    """runc.py: the worker's supervisor (and the runtime) killed behind the agent's back,
    while it watches and while it is away: the worker is reported lost, and its container,
    if the runtime's death left it running, is killed and deleted (it would hold the GPUs)."""
    state = tmp_path / "state"
    m = manager(state, minion, image, launcher=launcher)
    running, later = await two_sleepers(m, minion)

    async def kill_supervisor(placement: str) -> str:
        w = m.active[placement]
        name = str(json.loads(w.file("runc.json").read_text())["name"])
        for _ in range(100):  # started.json is written as it starts: wait till it runs
            if container_there(launcher, name):
                break
            await asyncio.sleep(0.1)
        os.killpg(int(w.file("supervisor.pid").read_text()), signal.SIGKILL)
        assert w.proc is not None
        w.proc.wait(timeout=10)  # gone (and reaped) before anyone looks: no race with it
        return name

    name = await kill_supervisor(running.placement_id)
    if launcher == "runc":  # still there: runc's death does not end the container
        assert container_there(launcher, name)
    done = await until_finished(m, running.placement_id)
    assert (done.state, done.reason) == (WorkerState.failed, PodmanRuntime.lost_at_runtime)
    assert not container_there(launcher, name)
    name = await kill_supervisor(later.placement_id)
    again = manager(state, minion, image, launcher=launcher)
    assert again.recover().lost == [later.placement_id]
    gone = await until_finished(again, later.placement_id)
    assert (gone.state, gone.reason) == (WorkerState.failed, PodmanRuntime.lost_at_restart)
    assert not container_there(launcher, name)
    assert not container_there(launcher, name, cgroup_left=True)


CGROUP_PROBE = """
import glob, json, os
def first(*paths):
    for p in paths:
        try:
            return open(p).read().split()[0]
        except OSError:
            pass
print(json.dumps({
    'cpu_quota': first('/sys/fs/cgroup/cpu.max', '/sys/fs/cgroup/cpu/cpu.cfs_quota_us'),
    'memory': first('/sys/fs/cgroup/memory.max', '/sys/fs/cgroup/memory/memory.limit_in_bytes'),
    'cuda': os.environ.get('CUDA_VISIBLE_DEVICES'),
    'nvidia': os.environ.get('NVIDIA_VISIBLE_DEVICES'),
    'gpu_devices': glob.glob('/dev/nvidia*'),
}))
"""


async def test_a_cpu_only_worker_gets_its_cpus_and_no_gpu(
    tmp_path: Path, minion: str, image: str
) -> None:
    """R-JOB-2: `--cpus cpu_count` (a CFS quota of 8 CPUs), whatever GPUFLEET_WORKER_CPUS
    says; the operator's memory limit; no GPU device, CUDA_VISIBLE_DEVICES empty and
    NVIDIA_VISIBLE_DEVICES=void, a job's own value of it not passed on."""
    m = manager(tmp_path / "state", minion, image, cpus=1)
    cmd = start(
        minion, CGROUP_PROBE, gpu_indices=[], cpu_count=8, env={"NVIDIA_VISIBLE_DEVICES": "all"}
    )
    assert m.start(cmd)
    done = await until_finished(m, cmd.placement_id)
    assert (done.state, done.exit_code) == (WorkerState.finished, 0), done.log_tail
    assert json.loads(done.log_tail) == {
        "cpu_quota": "800000",  # 8 x the 100 ms period
        "memory": str(256 * 2**20),
        "cuda": "",
        "nvidia": "void",
        "gpu_devices": [],
    }
