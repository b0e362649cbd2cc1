"""Jobs in containers, through the CLI (issue 14): the node agent with its defaults (no
opt-in to bare processes), so the node owner's jobs run as podman containers too; a local
registry with basic auth holds a customer image. Skipped only where podman or
docker-registry is missing (`just setup` installs both).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpufleet_devstack.pyindex import LocalIndex, debian_reachable, host_address, wheel
from gpufleet_devstack.registry import LocalRegistry, find_registry, running_registry
from gpufleet_devstack.registry import build_and_push as registry_image
from gpufleet_node_agent.baseimage import (
    BASE_IMAGE,
    default_containers_conf,
    ensure_image,
    podman_env,
)

from .conftest import System, _running_system
from .test_faults import placements_per_job

pytestmark = pytest.mark.skipif(
    shutil.which("podman") is None or find_registry() is None,
    reason="podman or docker-registry is not installed (just setup installs them)",
)

USER, PASSWORD = "team", f"pw-{uuid.uuid4().hex}"
MARKER = "from the customer image"
ENV = podman_env(default_containers_conf())


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRegistry]:
    with running_registry(tmp_path_factory.mktemp("registry"), {USER: PASSWORD}) as reg:
        yield reg


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str | None]:
    """A PEP 503 index of one test wheel on the host's own address (a build container
    reaches it, never the host's loopback); None where packages cannot be built here."""
    address = host_address()
    if address is None or not debian_reachable():  # pip itself comes from Debian's packages
        yield None
        return
    root = tmp_path_factory.mktemp("index")
    wheel(root, "gpufleet-e2e", "1.0", "VERSION = 'e2e 1.0'\n")
    local = LocalIndex(root, address).start()
    yield local.url
    local.stop()


@pytest.fixture(scope="module")
def system(
    tmp_path_factory: pytest.TempPathFactory, registry: LocalRegistry, index: str | None
) -> Iterator[System]:
    error = asyncio.run(ensure_image(BASE_IMAGE, ENV))
    assert error is None, error
    agent = {
        "GPUFLEET_WORKER_INSECURE_REGISTRIES": registry.address,
        "GPUFLEET_WORKER_MEMORY_MB": "256",
    }
    if index is not None:
        agent["GPUFLEET_PACKAGE_INDEX_URL"] = index
    yield from _running_system(tmp_path_factory, agent)


def logs(system: System, job_id: str) -> str:
    return system.cli("job", "logs", job_id).stdout


PROBE = """
import json, os, socket
def readable(p):
    try:
        open(p).read(); return True
    except OSError:
        return False
def environ(pid):
    try:
        return open(f'/proc/{pid}/environ', 'rb').read().decode(errors='replace')
    except OSError:
        return ''
def connects(port):
    s = socket.socket(); s.settimeout(1)
    try:
        s.connect(('127.0.0.1', port)); return True
    except OSError:
        return False
pids = [p for p in os.listdir('/proc') if p.isdigit()]
print('PROBE ' + json.dumps({
    'uid': os.getuid(),
    'other_env': any('%(secret)s' in environ(p) for p in pids),
    'host_root': os.path.exists(%(root)r),
    'shadow': readable('/etc/shadow'),
    'nats': connects(%(nats)d),
    'cuda': os.environ.get('CUDA_VISIBLE_DEVICES'),
}))
"""


def test_a_job_in_its_container_sees_nothing_of_another_job_the_agent_or_the_host(
    system: System,
) -> None:
    secret = f"alpha-{uuid.uuid4().hex}"
    other = system.submit(
        "-e", f"SECRET_A={secret}", "--", "sh", "-c", "echo $SECRET_A > /opt/ml/output/a; sleep 60",
        name="holder",
    )  # fmt: skip
    system.wait_state(other, "running", timeout=60)
    probe = PROBE % {"secret": secret, "root": str(system.root), "nats": system.nats.port}
    job_id = system.submit("--", "python3", "-c", probe, name="probe")
    job = system.wait_state(job_id, "finished", "failed", timeout=60)
    assert job["state"] == "finished", job
    line = next(x for x in logs(system, job_id).splitlines() if x.startswith("PROBE "))
    seen = json.loads(line.removeprefix("PROBE "))
    assert seen == {
        "uid": 10000,  # not root
        "other_env": False,  # the other job's env is in no process it can see
        "host_root": False,  # the system's files (agent state, NATS store) are not there
        "shadow": False,
        "nats": False,  # --network none: no route to the control plane
        # simulated GPUs: the placement's indices, as in the process runtime
        "cuda": ",".join(str(i) for i in job["workers"][0]["gpu_indices"]),
    }
    system.cli("job", "cancel", other)
    system.wait_state(other, "cancelled", "stopped", "failed", "finished", timeout=60)


def test_a_job_over_its_memory_is_killed_and_fails_saying_so(system: System) -> None:
    job_id = system.submit(
        "--", "python3", "-c", "b = bytearray(600 * 2**20); print(len(b))", name="hog"
    )
    job = system.wait_state(job_id, "failed", "finished", timeout=60)
    assert job["state"] == "failed", job
    assert "out of memory" in json.dumps(job["history"][-1])


def build_and_push(context: Path, reg: LocalRegistry) -> str:
    """The marker image, pushed to `reg`; the local copy is removed, so the worker's pull
    must fetch it."""
    ref = f"team/marker:{uuid.uuid4().hex[:8]}"
    files = {"marker": f"echo '{MARKER}' > marker"}
    return registry_image(reg, context, ref, files, creds=(USER, PASSWORD), env=ENV)


def test_a_customer_image_is_pulled_with_the_accounts_attached_registry_key(
    system: System, registry: LocalRegistry, tmp_path: Path
) -> None:
    ref = build_and_push(tmp_path / "ctx", registry)
    key = tmp_path / "docker.json"
    key.write_text(
        json.dumps({"username": USER, "password": PASSWORD, "registry": registry.address})
    )
    system.cli("key", "add", "docker", "--from-file", str(key))
    key.unlink()
    assert PASSWORD not in system.cli("key", "list", "--json").stdout
    job_id = system.submit("--image", ref, "--key", "docker", "--", "cat", "/marker")
    job = system.wait_state(job_id, "finished", "failed", timeout=120)
    assert job["state"] == "finished", job
    assert MARKER in logs(system, job_id)
    assert PASSWORD not in json.dumps(job)
    denied = system.submit("--image", ref, "--", "cat", "/marker", name="no-key")
    job = system.wait_state(denied, "failed", "finished", timeout=120)
    assert job["state"] == "failed"
    assert "cannot pull image" in json.dumps(job["history"][-1])


def test_a_base_environment_job_gets_its_pip_package_installed_before_it_runs(
    system: System, index: str | None
) -> None:
    if index is None:
        pytest.skip("no non-loopback address or deb.debian.org here: no package build")
    code = "import gpufleet_e2e; print('PKG', gpufleet_e2e.VERSION)"
    job_id = system.submit("--pip", "gpufleet-e2e==1.0", "--", "python3", "-c", code, name="pip")
    job = system.wait_state(job_id, "finished", "failed", timeout=600)
    assert job["state"] == "finished", job
    assert "PKG e2e 1.0" in logs(system, job_id)


def test_an_agent_restart_mid_job_reattaches_its_container(system: System) -> None:
    job_id = system.submit("--", "sh", "-c", "echo before; sleep 6; echo after", name="survivor")
    system.wait_state(job_id, "running", timeout=60)
    system.kill("node-agent")
    time.sleep(1)
    system.restart("node-agent")
    job = system.wait_state(job_id, "finished", "failed", timeout=90)
    assert job["state"] == "finished", job
    assert "after" in logs(system, job_id)
    assert placements_per_job(system).get(job_id, 1) == 1
