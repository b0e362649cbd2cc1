"""Base environments and packages (R-JOB-7) against real podman: a job's packages come from
a local package index (a PEP 503 simple index of wheels built here, served on the host's
own address, which the build network reaches and the job's does not), are installed in a
build with the network, in the order apt, conda, requirements.txt, pip, and the job runs
offline in the result; a second job finds the build (no new build); concurrent workers
wait for one build; a failing install fails the worker with its step and output; a
requirements.txt at the top of the staged model code takes the requirements.txt place.

python3-pip and the apt test's package come from Debian's archive (deb.debian.org, reached
from the build container); the tests are skipped where it cannot be reached.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from gpufleet_contracts.jobs import Mount, MountKind, StartWorker, WorkerState
from gpufleet_contracts.jobspec import BaseEnvironment, Packages
from gpufleet_contracts.locations import GitSource, Source
from gpufleet_devstack.pyindex import LocalIndex, debian_reachable, host_address, wheel
from gpufleet_node_agent.baseimage import BASE_IMAGE, podman_env
from gpufleet_node_agent.builds import BuildConfig, container_argv
from gpufleet_node_agent.environments import ENV_REPO
from gpufleet_node_agent.packages import NO_CONDA, PKG_REPO
from gpufleet_node_agent.runtimes.podman import PodmanRuntime
from gpufleet_node_agent.runtimes.podman_args import PodmanConfig
from gpufleet_node_agent.staging.registry import Fetchers, Transfer
from gpufleet_node_agent.worker.manager import WorkerManager

from .podman_support import CONF, Broker, container_record, until_finished

pytestmark = [
    pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed"),
    pytest.mark.skipif(host_address() is None, reason="the host has no non-loopback address"),
    pytest.mark.skipif(not debian_reachable(), reason="deb.debian.org is not reachable"),
]


@dataclass
class Index:
    url: str
    requests: list[str]


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Index]:
    """A PEP 503 simple index of test wheels on the host's own address."""
    root = tmp_path_factory.mktemp("index")
    wheel(root, "gpufleet-tiny", "0.9", "VERSION = '0.9'\n")
    wheel(root, "gpufleet-tiny", "1.0", "VERSION = '1.0'\n")
    wheel(root, "gpufleet-req", "1.0", "VALUE = 'from requirements.txt'\n")
    wheel(root, "torch", "2.3.0", "__version__ = '2.3.0+gpufleet-test'\n")
    local = LocalIndex(root, str(host_address())).start()
    yield Index(local.url, local.requests)
    local.stop()


def podman(*args: str) -> str:
    res = subprocess.run(["podman", *args], env=podman_env(CONF), capture_output=True, text=True)
    return res.stdout.strip()


def manager(
    state: Path, minion: str, index: Index, fetchers: Fetchers | None = None
) -> WorkerManager:
    config = PodmanConfig(
        image=BASE_IMAGE,
        containers_conf=CONF,
        memory_mb=256,
        cpus=1,
        stop_grace_s=2,
        build=BuildConfig(index_url=index.url, timeout_s=600, build_dir=state / "builds"),
    )
    runtime = PodmanRuntime(config, minion, fetchers=fetchers)
    runtime.node_gpus = 1
    return WorkerManager(state, minion, Broker(), gpu_indices=[0], runtime=runtime)


def start(minion: str, code: str, owner: str, **kw: Any) -> StartWorker:
    placement = uuid.uuid4().hex
    return StartWorker(
        minion_id=minion,
        job_id=f"job-{placement[:6]}",
        job_name="pkgs",
        worker=0,
        command=["python3", "-c", code],
        gpu_indices=[0],
        placement_id=placement,
        owner=owner,
        creator=owner,
        base_environment=BaseEnvironment(python_version="3.11", framework="deep_learning"),
        **kw,
    )


def built(m: WorkerManager, repo: str = PKG_REPO) -> list[str]:
    """The tags of `repo` the manager's runtime built (not found in the store)."""
    runtime = m.runtime
    assert isinstance(runtime, PodmanRuntime)
    return [t for t in runtime.builder.built if t.startswith(repo + ":")]


def run_image(m: WorkerManager, placement: str) -> str:
    """The image its container ran."""
    return str((container_record(m.worker_dir(placement)) or {})["image"])


JOB = """
import socket, sys
import gpufleet_tiny, gpufleet_req
s = socket.socket(); s.settimeout(2)
try:
    s.connect((sys.argv[1], int(sys.argv[2]))); online = True
except OSError:
    online = False
print(gpufleet_tiny.VERSION, gpufleet_req.VALUE, "online" if online else "offline")
"""


async def test_pip_and_requirements_from_the_index_in_order_once_per_node(
    tmp_path: Path, minion: str, index: Index
) -> None:
    owner = f"acct-{uuid.uuid4().hex[:8]}"  # a fresh owner: a build of its own
    m = manager(tmp_path / "state", minion, index)
    # requirements.txt pins tiny 0.9, pip asks for 1.0: pip's step comes after, so 1.0 wins
    packages = Packages(
        requirements=["gpufleet-tiny==0.9", "gpufleet-req==1.0"], pip=["gpufleet-tiny==1.0"]
    )
    host, port = index.url.split("//")[1].split("/")[0].split(":")
    code = JOB.replace("sys.argv[1], int(sys.argv[2])", f"{host!r}, {port}")
    first = [start(minion, code, owner, packages=packages) for _ in range(2)]
    for cmd in first:  # two workers at once need the same build: one build, one waits
        assert m.start(cmd)
    for cmd in first:
        done = await until_finished(m, cmd.placement_id, within=600)
        assert (done.state, done.exit_code) == (WorkerState.finished, 0), done.reason
        assert done.log_tail.endswith("1.0 from requirements.txt offline\n"), done.log_tail
    logs = [m.worker_dir(c.placement_id).joinpath("log").read_text() for c in first]
    assert sum("gpufleet: building localhost/gpufleet/pkgs:" in log for log in logs) == 1
    assert sum("gpufleet: waiting for localhost/gpufleet/pkgs:" in log for log in logs) == 1
    assert all("gpufleet: packages: requirements.txt (2), then pip (1)" in log for log in logs)
    tag = run_image(m, first[0].placement_id)
    assert built(m) == [tag]
    image_id = podman("image", "inspect", "--format", "{{.Id}}", tag)
    fetched = len(index.requests)
    # later, a third job with the same packages: the cached image, no build, no download
    again = start(minion, code, owner, packages=packages)
    assert m.start(again)
    done = await until_finished(m, again.placement_id, within=120)
    assert (done.state, done.exit_code) == (WorkerState.finished, 0), done.reason
    assert built(m) == [tag]
    assert len(index.requests) == fetched
    assert tag == run_image(m, again.placement_id)
    assert podman("image", "inspect", "--format", "{{.Id}}", tag) == image_id
    podman("rmi", "--force", tag)


async def test_a_requirements_txt_of_the_model_code_takes_the_requirements_txt_place(
    tmp_path: Path, minion: str, index: Index
) -> None:
    """The model code's requirements.txt (here a fetcher's, as git would stage it) pins tiny
    0.9, the spec's pip asks for 1.0: apt, conda, that file, pip; 1.0 wins."""

    async def clone(source: Source, dest: Path, t: Transfer) -> None:
        (dest / "requirements.txt").write_text("# the model's\ngpufleet-tiny==0.9\ngpufleet-req\n")

    owner = f"acct-{uuid.uuid4().hex[:8]}"
    m = manager(tmp_path / "state", minion, index, Fetchers({"git": clone}))
    code = "import gpufleet_tiny, gpufleet_req; print(gpufleet_tiny.VERSION, gpufleet_req.VALUE)"
    model = Mount(
        target="/opt/ml/models",
        kind=MountKind.model,
        source=GitSource(url="https://git.example/model.git"),
        env="ML_MODEL_PATH",
    )
    cmd = start(minion, code, owner, packages=Packages(pip=["gpufleet-tiny==1.0"]), mounts=[model])
    assert m.start(cmd)
    done = await until_finished(m, cmd.placement_id, within=600)
    assert (done.state, done.exit_code) == (WorkerState.finished, 0), done.reason
    assert done.log_tail.endswith("1.0 from requirements.txt\n"), done.log_tail
    log = m.worker_dir(cmd.placement_id).joinpath("log").read_text()
    assert "packages: requirements.txt (/opt/ml/models/requirements.txt) (2), then pip (1)" in log
    podman("rmi", "--force", run_image(m, cmd.placement_id))


async def test_a_failing_install_fails_the_worker_with_its_step_and_output(
    tmp_path: Path, minion: str, index: Index
) -> None:
    owner = f"acct-{uuid.uuid4().hex[:8]}"
    m = manager(tmp_path / "state", minion, index)
    missing = start(minion, "print(1)", owner, packages=Packages(pip=["gpufleet-missing==9"]))
    conda = start(minion, "print(1)", owner, packages=Packages(conda=["numpy"]))
    for cmd in (missing, conda):
        assert m.start(cmd)
    done = await until_finished(m, missing.placement_id, within=600)
    assert done.state == WorkerState.failed
    assert done.reason is not None
    assert done.reason.startswith("package step pip failed (exit 1): "), done.reason
    assert "No matching distribution found for gpufleet-missing==9" in done.reason
    assert container_record(m.worker_dir(missing.placement_id)) is None  # never ran
    done = await until_finished(m, conda.placement_id, within=600)
    assert done.state == WorkerState.failed
    assert done.reason == f"package step conda failed (exit 3): ==> gpufleet step conda\n{NO_CONDA}"


async def test_a_framework_environment_is_built_once_then_apt_then_pip(
    tmp_path: Path, minion: str, index: Index
) -> None:
    env_image = "localhost/gpufleet/env:py3.11-pytorch-2.3.0"
    podman("rmi", "--force", env_image)  # built by this test, not found from an earlier run
    owner = f"acct-{uuid.uuid4().hex[:8]}"
    m = manager(tmp_path / "state", minion, index)
    torch = BaseEnvironment(python_version="3.11", framework="pytorch", framework_version="2.3.0")
    code = (
        "import subprocess, torch, gpufleet_tiny; "
        "print(torch.__version__, gpufleet_tiny.VERSION, flush=True); subprocess.run(['hello'])"
    )
    cmd = start(
        minion,
        code,
        owner,
        packages=Packages(apt=["hello"], pip=["gpufleet-tiny==1.0"]),
    ).model_copy(update={"base_environment": torch})
    assert m.start(cmd)
    done = await until_finished(m, cmd.placement_id, within=600)
    assert (done.state, done.exit_code) == (WorkerState.finished, 0), done.reason
    assert done.log_tail.endswith("2.3.0+gpufleet-test 1.0\nHello, world!\n"), done.log_tail
    assert f"gpufleet: building {env_image}" in done.log_tail
    assert built(m, ENV_REPO) == [env_image]  # then the packages on it
    assert len(built(m)) == 1
    assert podman("image", "exists", env_image) == ""
    # another Python: refused, naming the field; nothing built
    py310 = start(minion, "print(1)", owner).model_copy(
        update={"base_environment": torch.model_copy(update={"python_version": "3.10"})}
    )
    assert m.start(py310)
    refused = await until_finished(m, py310.placement_id)
    assert refused.state == WorkerState.failed
    assert refused.reason is not None
    assert refused.reason.startswith("environment.python_version 3.10: "), refused.reason
    assert len(built(m, ENV_REPO)) == len(built(m)) == 1
    tag = run_image(m, cmd.placement_id)
    await asyncio.to_thread(podman, "rmi", "--force", tag, env_image)


PROBE = """
import errno, json, os, socket, sys
def connects(host, port):
    s = socket.socket(); s.settimeout(2)
    try:
        s.connect((host, port)); return True
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e))
caps = [l.split()[1] for l in open('/proc/self/status') if l.startswith('CapEff')][0]
print(json.dumps({
    'uid': os.getuid(), 'caps': caps,
    'loopback': connects('127.0.0.1', %(port)d), 'slirp_host': connects('10.0.2.2', %(port)d),
    'host': connects(%(index_host)r, %(port)d), 'index': connects(%(index_host)r, %(index_port)d),
    'metadata': connects('169.254.169.254', 80), 'private': connects('10.1.2.3', 4222),
    'control_plane': connects(%(control)r, 4222), 'host_dir': os.path.exists(%(host_dir)r),
}))
"""
CONTROL = "203.0.113.7"  # stands for the control plane's NATS (TEST-NET-3: nothing answers)


async def test_a_build_container_reaches_the_index_but_not_the_host_nor_the_control_plane(
    tmp_path: Path, index: Index, minion: str
) -> None:
    """The build's own container settings and network confinement (`Builder.run`), with a
    probe in place of the install script: what third-party install code could reach.
    Refused by the build's egress table answers at once, EHOSTUNREACH (buildnet.py)."""
    listener = socket.socket()
    listener.bind(("0.0.0.0", 0))  # stands for NATS and the agent's services, every address
    listener.listen()
    host, port = index.url.split("//")[1].split("/")[0].split(":")
    probe = PROBE % {
        "port": listener.getsockname()[1],
        "index_host": host,
        "index_port": int(port),
        "control": CONTROL,
        "host_dir": str(tmp_path),
    }
    config = BuildConfig(
        index_url=index.url, build_dir=tmp_path / "builds", control_plane=(f"nats://{CONTROL}",)
    )
    runtime = PodmanRuntime(
        PodmanConfig(image=BASE_IMAGE, containers_conf=CONF, build=config), minion
    )
    name = f"gpufleet-probe-{uuid.uuid4().hex[:8]}"
    log = tmp_path / "probe.log"
    try:
        with log.open("w") as out:
            run = await runtime.builder.run(
                name, container_argv(name, BASE_IMAGE, ["python3", "-c", probe], config), out
            )
    finally:
        await runtime.builder.podman("rm", "--force", name)
        listener.close()
    assert (run.error, run.code, run.timed_out) == (None, 0, False), log.read_text()
    seen = json.loads(log.read_text().splitlines()[-1])
    assert seen["index"] is True  # the operator's index, on the host's address: its port only
    assert seen["loopback"] == "ECONNREFUSED"  # its own loopback: nothing of the host's there
    refused = ("slirp_host", "host", "metadata", "private", "control_plane")
    assert {k: seen[k] for k in refused} == dict.fromkeys(refused, "EHOSTUNREACH")
    assert seen["host_dir"] is False
    assert seen["uid"] == 0
    # exactly CHOWN DAC_OVERRIDE FOWNER FSETID SETGID SETUID SETFCAP (bits 0-4, 6, 7, 31)
    assert int(seen["caps"], 16) == sum(1 << b for b in (0, 1, 3, 4, 6, 7, 31))
