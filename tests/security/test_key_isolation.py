"""Attack class 8 (continued): a job hunting for another worker's attached keys on the same
node, in real podman containers (skipped where podman is not installed).

The victim's worker holds a key at /run/secrets; beside it, the attacker's worker searches
everything it can see: every file it can read (for the value itself), every process's
environment and command line it can see, its mounts, and the host path of the victim's key
files. It must find nothing.
"""

from __future__ import annotations

import base64
import json
import shutil
import uuid
from pathlib import Path

import pytest
from gpufleet_contracts.jobs import StartWorker, WorkerState
from gpufleet_node_agent.runtimes.podman import PodmanRuntime
from gpufleet_node_agent.runtimes.podman_args import PodmanConfig
from gpufleet_node_agent.worker.manager import WorkerManager
from integration.node_agent.podman_support import (
    CONF,
    Broker,
    image,  # noqa: F401  (fixture)
    minion,  # noqa: F401  (fixture)
    until_finished,
    until_started,
)

pytestmark = pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed")

VALUE = f"victim-key-{uuid.uuid4().hex}"
# The attacker knows the value only reversed and encoded, so its own command line and
# source never hold it: whatever it finds, it found.
HUNT = """
import base64, json, os, sys
value = base64.b64decode(sys.argv[1]).decode()[::-1].encode()
found = []
for root, dirs, files in os.walk('/'):
    if root.startswith(('/proc', '/sys', '/dev')):
        dirs[:] = []
        continue
    for name in files:
        p = os.path.join(root, name)
        try:
            if value in open(p, 'rb').read(1 << 20):
                found.append(p)
        except OSError:
            pass
for pid in os.listdir('/proc'):
    for part in ('environ', 'cmdline'):
        try:
            if pid.isdigit() and value in open(f'/proc/{pid}/{part}', 'rb').read():
                found.append(f'/proc/{pid}/{part}')
        except OSError:
            pass
mounts = [line.split()[4] for line in open('/proc/self/mountinfo')]
print(json.dumps({
    'found': found,
    'secret_mounts': [m for m in mounts if 'secrets' in m],
    'host_path': os.path.exists(sys.argv[2]),
    'run': sorted(os.listdir('/run')),
}))
"""


async def test_a_job_cannot_read_another_workers_keys(
    tmp_path: Path,
    minion: str,  # noqa: F811
    image: str,  # noqa: F811
) -> None:
    config = PodmanConfig(image=image, containers_conf=CONF, memory_mb=256, cpus=1, stop_grace_s=2)
    runtime = PodmanRuntime(config, minion)
    runtime.node_gpus = 2
    m = WorkerManager(tmp_path, minion, Broker(), gpu_indices=[0, 1], runtime=runtime)  # type: ignore[arg-type]

    def start(gpu: int, command: list[str], **kw: object) -> StartWorker:
        placement = uuid.uuid4().hex
        return StartWorker.model_validate(
            {
                "minion_id": minion,
                "job_id": f"job-{placement[:6]}",
                "job_name": "k",
                "worker": 0,
                "command": command,
                "gpu_indices": [gpu],
                "placement_id": placement,
                **kw,
            }
        )

    victim = start(
        0,
        ["python3", "-c", "import time; time.sleep(30)"],
        attached_keys={"huggingface": {"token": VALUE}},
        owner="local",
        creator="local",
    )
    assert m.start(victim)
    await until_started(m, victim.placement_id)
    key_file = m.worker_dir(victim.placement_id) / "secrets" / "huggingface" / "token"
    hint = base64.b64encode(VALUE[::-1].encode()).decode()
    attacker = start(
        1, ["python3", "-c", HUNT, hint, str(key_file)], owner="mallory", creator="mallory"
    )
    assert m.start(attacker)
    done = await until_finished(m, attacker.placement_id, within=120)
    assert (done.state, done.exit_code) == (WorkerState.finished, 0), done.log_tail
    seen = json.loads(done.log_tail)
    assert seen["found"] == [] and seen["secret_mounts"] == []
    assert seen["host_path"] is False and "secrets" not in seen["run"]
    assert key_file.read_text() == VALUE  # it was there all along, for the victim's worker
    m.stop(victim.job_id, 0, victim.placement_id)
    await until_finished(m, victim.placement_id)
    assert not key_file.parent.parent.exists()
