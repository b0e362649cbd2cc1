"""A node's host "rebooted": the node agent and every worker gone at once, containers too.

The agent runs with its defaults (no opt-in to bare processes: each worker in a
container, as in test_runtime.py). The reboot is simulated as kill -9 of the agent and
removal of every container of the node (kill -9 of the supervisors and of crun's
containers, their state and cgroups removed; `runc delete`; `podman rm --force`); then the
agent starts again. Each worker that was running is then failed with a reason (its
container is gone: the agent reports it lost), never run twice at once, and billed once;
the node's GPUs are free again for the next job. Skipped only where podman is missing
(`just setup` installs it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gpufleet_devstack import wait_for
from gpufleet_devstack.up import NODE_NAME
from gpufleet_node_agent.baseimage import BASE_IMAGE, default_containers_conf, ensure_image
from gpufleet_node_agent.baseimage import podman_env as make_podman_env
from gpufleet_node_agent.runtimes.cgroupv1 import Cgroups
from gpufleet_node_agent.runtimes.podman_args import LABEL
from gpufleet_node_agent.runtimes.runc import CRUN_ROOT, DEFAULT_ROOT

from .conftest import System, _running_system
from .invariants import (
    charges_per_job,
    gpus_given_twice,
    history_gaps,
    ledger_drift,
    stream_events,
)

pytestmark = pytest.mark.skipif(
    shutil.which("podman") is None, reason="podman is not installed (just setup installs it)"
)

ENV = make_podman_env(default_containers_conf())
RUNC = ["runc", "--root", str(DEFAULT_ROOT)]
CRUN = ["crun", "--cgroup-manager=disabled", "--root", str(CRUN_ROOT)]
MINION = f"{LABEL}.minion"


def node_containers() -> list[str]:
    """Names of the containers of the e2e node (every state): the ones crun (the default)
    or runc started (runc.py) and any `podman run` did."""
    oci = runc_containers() + crun_containers()
    return podman_containers() + [str(c["id"]) for c in oci]


def podman_containers() -> list[str]:
    res = subprocess.run(
        ["podman", "ps", "--all", "--filter", f"label=gpufleet.minion={NODE_NAME}",
         "--format", "{{.Names}}"],
        env=ENV, capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    return res.stdout.split()


def runc_containers() -> list[dict[str, Any]]:
    res = subprocess.run(
        [*RUNC, "list", "--format", "json"], capture_output=True, check=True, timeout=60
    )
    listed = json.loads(res.stdout or b"null") or []
    return [c for c in listed if (c.get("annotations") or {}).get(MINION) == NODE_NAME]


def crun_containers() -> list[dict[str, Any]]:
    if shutil.which("crun") is None:
        return []
    res = subprocess.run(
        [*CRUN, "list", "--format", "json"], capture_output=True, check=True, timeout=60
    )
    ours = []
    for c in json.loads(res.stdout or b"null") or []:
        with contextlib.suppress(OSError, ValueError):  # crun's copy of its config
            config = json.loads((CRUN_ROOT / c["id"] / "config.json").read_text())
            if (config.get("annotations") or {}).get(MINION) == NODE_NAME:
                ours.append({**c, "annotations": config["annotations"]})
    return ours


def supervisor_pid(annotations: dict[str, str]) -> str:
    """The pid of the supervisor of a container's worker (its directory is an annotation;
    the bundle is on tmpfs, apart from it)."""
    return (Path(annotations[f"{LABEL}.dir"]) / "supervisor.pid").read_text().strip()


def reboot_containers() -> None:
    """What a reboot does to the node's containers: runc's gone with their supervisors (the
    shell and runc in the foreground, killed first: a reboot leaves no `exit` behind), and
    podman's."""
    for c in runc_containers():
        pid = supervisor_pid(c["annotations"])
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(pid), signal.SIGKILL)
        subprocess.run([*RUNC, "delete", "--force", c["id"]], capture_output=True, timeout=60)
    cgroups, _ = Cgroups.here()
    for c in crun_containers():  # crun's: the same, and their cgroups gone with the boot
        pid = supervisor_pid(c["annotations"])
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(pid), signal.SIGKILL)
        subprocess.run([*CRUN, "delete", "--force", c["id"]], capture_output=True, timeout=60)
        if cgroups is not None:
            assert cgroups.remove(c["id"])
    podman = podman_containers()
    if podman:
        subprocess.run(["podman", "rm", "--force", "--time", "0", *podman], env=ENV,
                       capture_output=True, check=True, timeout=120)  # fmt: skip


@pytest.fixture
def container_system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    error = asyncio.run(ensure_image(BASE_IMAGE, ENV))
    assert error is None, error
    yield from _running_system(tmp_path_factory, {})  # the default runtime: containers


def test_a_rebooted_host_fails_its_workers_with_a_reason_and_bills_each_once(
    container_system: System,
) -> None:
    system = container_system
    # Two one-GPU jobs fill the node's two GPUs; a third waits for one of them.
    running = [system.submit("--", "sh", "-c", "echo up; sleep 600", name=f"r{i}") for i in (0, 1)]
    for job_id in running:
        system.wait_state(job_id, "running", timeout=120)
    waiting = system.submit("--", "sh", "-c", "echo next", name="next")
    wait_for(lambda: len(node_containers()) >= 2, timeout=60)

    # The reboot: the agent and every container of its node gone at once.
    system.kill("node-agent")
    reboot_containers()
    assert node_containers() == []
    system.restart("node-agent")

    for job_id in running:
        # Failed with the reason (no requeue: the node itself never went away).
        job = system.wait_state(job_id, "failed", timeout=120)
        reason = json.dumps(job["history"][-1])
        assert "lost" in reason and "container" in reason, job
    # The GPUs they held are free: the waiting job runs and finishes.
    assert system.wait_state(waiting, "finished", "failed", timeout=180)["state"] == "finished"

    jobs = [*running, waiting]
    assert gpus_given_twice(system, jobs) == []
    # Never run twice: one placement and one start per job in the whole event history.
    facts = Counter((str(b.get("job_id")), t) for _, t, b in stream_events(system))
    for job_id in jobs:
        assert facts[(job_id, "gpufleet.worker.placed.v1")] == 1, job_id
        assert facts[(job_id, "gpufleet.worker.started.v1")] == 1, job_id
    assert node_containers() == []  # nothing of the lost workers came back
    # Billed once each: one charge per run, whatever the agent reported twice.
    wait_for(lambda: set(charges_per_job(system)) >= set(jobs), timeout=60)
    assert {j: charges_per_job(system)[j] for j in jobs} == dict.fromkeys(jobs, 1)
    assert ledger_drift(system) == []
    wait_for(lambda: history_gaps(system, jobs) == [], timeout=60)
