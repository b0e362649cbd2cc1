"""A job's own image (R-JOB-7) against real podman and a real local registry (Debian's
docker-registry, with basic auth): pulled with the job's credential and run; refused with a
clear reason for wrong credentials or an image that does not fit `disk_size_gb`.

The test images are built here from the node's base image (`podman build` with COPY only)
and pushed to the local registry; nothing comes from any other registry.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gpufleet_contracts.images import RegistryAuth
from gpufleet_contracts.jobs import StartWorker, WorkerState
from gpufleet_devstack.registry import LocalRegistry, find_registry, running_registry
from gpufleet_devstack.registry import build_and_push as registry_image
from gpufleet_node_agent.baseimage import (
    BASE_IMAGE,
    ensure_image,
    podman_env,
)
from gpufleet_node_agent.images import AUTH_FILE, REGISTRY_FILE
from gpufleet_node_agent.runtimes.podman import PodmanRuntime
from gpufleet_node_agent.runtimes.podman_args import PodmanConfig
from gpufleet_node_agent.worker.manager import WorkerManager

from .podman_support import CONF, Broker, container_record, until_finished

pytestmark = pytest.mark.skipif(
    shutil.which("podman") is None or find_registry() is None,
    reason="podman or docker-registry is not installed (just setup installs them)",
)

USER, PASSWORD = "team", f"pw-{uuid.uuid4().hex}"
MARKER = "from the customer image"


def podman(*args: str) -> None:
    res = subprocess.run(["podman", *args], env=podman_env(CONF), capture_output=True, text=True)
    assert res.returncode == 0, f"podman {' '.join(args)}: {res.stderr}"


def build_and_push(context: Path, reg: LocalRegistry, name: str, files: dict[str, str]) -> str:
    """An image FROM the base image with `files` (name: how to make it) at /, pushed to
    `reg`; the local copy is removed, so a worker's pull must fetch it."""
    ref = f"team/{name}:1"
    return registry_image(reg, context, ref, files, creds=(USER, PASSWORD), env=podman_env(CONF))


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRegistry]:
    error = asyncio.run(ensure_image(BASE_IMAGE, podman_env(CONF)))
    assert error is None, error
    with running_registry(tmp_path_factory.mktemp("registry"), {USER: PASSWORD}) as reg:
        yield reg


@pytest.fixture(scope="module")
def marker_image(registry: LocalRegistry, tmp_path_factory: pytest.TempPathFactory) -> str:
    ctx = tmp_path_factory.mktemp("marker") / "ctx"
    return build_and_push(ctx, registry, "marker", {"marker": f"echo '{MARKER}' > marker"})


def manager(state: Path, minion: str, registry: LocalRegistry) -> WorkerManager:
    config = PodmanConfig(
        image=BASE_IMAGE,
        containers_conf=CONF,
        memory_mb=256,
        cpus=1,
        stop_grace_s=2,
        insecure_registries=(registry.address,),
    )
    runtime = PodmanRuntime(config, minion)
    runtime.node_gpus = 1
    return WorkerManager(state, minion, Broker(), gpu_indices=[0], runtime=runtime)


def start(minion: str, command: list[str], **kw: Any) -> StartWorker:
    placement = uuid.uuid4().hex
    return StartWorker(
        minion_id=minion,
        job_id=f"job-{placement[:6]}",
        job_name="img",
        worker=0,
        command=command,
        gpu_indices=[0],
        placement_id=placement,
        **kw,
    )


def no_credential_left(m: WorkerManager, cmd: StartWorker) -> None:
    wd = m.worker_dir(cmd.placement_id)
    assert not (wd / REGISTRY_FILE).exists() and not (wd / AUTH_FILE).exists()
    assert PASSWORD not in (wd / "spec.json").read_text()
    assert all(PASSWORD.encode() not in msg for _, msg, _ in m.broker.sent)  # type: ignore[attr-defined]


async def test_a_job_runs_in_its_image_pulled_with_its_credential(
    tmp_path: Path, minion: str, registry: LocalRegistry, marker_image: str
) -> None:
    m = manager(tmp_path / "state", minion, registry)
    auth = RegistryAuth(username=USER, password=PASSWORD)
    cmd = start(minion, ["cat", "/marker"], image=marker_image, registry_auth=auth)
    assert m.start(cmd)
    assert (m.worker_dir(cmd.placement_id) / REGISTRY_FILE).stat().st_mode & 0o777 == 0o600
    done = await until_finished(m, cmd.placement_id)
    assert (done.state, done.exit_code) == (WorkerState.finished, 0), done.reason
    assert done.log_tail == f"gpufleet: pulling image {marker_image}\n{MARKER}\n"  # prepare.py
    no_credential_left(m, cmd)
    # without an image: the node's base image, which has no /marker
    base = start(minion, ["cat", "/marker"])
    assert m.start(base)
    plain = await until_finished(m, base.placement_id)
    assert (plain.state, plain.exit_code) == (WorkerState.failed, 1)


async def test_a_pull_with_wrong_credentials_fails_the_worker(
    tmp_path: Path, minion: str, registry: LocalRegistry, marker_image: str
) -> None:
    m = manager(tmp_path / "state", minion, registry)
    wrong = RegistryAuth(username=USER, password="not-the-password")
    cmds = [
        start(minion, ["cat", "/marker"], image=marker_image, registry_auth=wrong),
        start(minion, ["cat", "/marker"], image=marker_image),  # none: not the node's logins
    ]
    for cmd in cmds:
        assert m.start(cmd)
    for cmd in cmds:
        done = await until_finished(m, cmd.placement_id)
        assert done.state == WorkerState.failed
        assert done.reason is not None
        assert done.reason.startswith(f"cannot pull image {marker_image}: "), done.reason
        assert "unauthorized" in done.reason or "authentication required" in done.reason
        no_credential_left(m, cmd)


async def test_an_image_too_big_for_the_disk_is_refused(
    tmp_path: Path, minion: str, registry: LocalRegistry
) -> None:
    big = build_and_push(
        tmp_path / "ctx",
        registry,
        "big",
        {"filler": "head -c 1100000000 /dev/zero > filler"},
    )
    m = manager(tmp_path / "state", minion, registry)
    auth = RegistryAuth(username=USER, password=PASSWORD)
    cmd = start(minion, ["true"], image=big, registry_auth=auth, disk_size_gb=1)
    assert m.start(cmd)
    done = await until_finished(m, cmd.placement_id, within=300)
    assert done.state == WorkerState.failed
    assert done.reason == "image of 1.4 GB does not fit disk_size_gb 1"
    assert container_record(m.worker_dir(cmd.placement_id)) is None  # never ran
    fits = start(minion, ["true"], image=big, registry_auth=auth, disk_size_gb=2)
    assert m.start(fits)
    ok = await until_finished(m, fits.placement_id, within=300)
    assert (ok.state, ok.exit_code) == (WorkerState.finished, 0), ok.reason
    podman("rmi", "--force", big)
