"""A worker's attached keys (R-JOB-7) in its container, against real podman: the worker sees
its key as a file (0400, its uid, under /run/secrets), a second worker beside it does not,
and the node keeps nothing of it once the worker has ended.

Skipped only where podman is not installed (as the other podman tests).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest
from gpufleet_contracts.jobs import StartWorker, WorkerState
from gpufleet_node_agent.runtimes.podman import PodmanRuntime
from gpufleet_node_agent.runtimes.podman_args import PodmanConfig
from gpufleet_node_agent.worker.manager import WorkerManager

from .podman_support import CONF, Broker, until_finished, until_started

pytestmark = pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed")

VALUE = f"hf-{uuid.uuid4().hex}"
DIGEST = hashlib.sha256(VALUE.encode()).hexdigest()

# What a worker finds of the key (never the value itself: a hash of what it read).
PROBE = """
import hashlib, json, os, stat, sys, time
p = '/run/secrets/huggingface/token'
def digest(path):
    try:
        return hashlib.sha256(open(path, 'rb').read()).hexdigest()
    except OSError as exc:
        return type(exc).__name__
seen = {
    'secrets_path': os.environ.get('SECRETS_PATH'),
    'file': digest(p),
    'other': digest(sys.argv[1]),
    'in_env': any(hashlib.sha256(v.encode()).hexdigest() == %(digest)r
                  for v in os.environ.values()),
}
if os.path.exists(p):
    st = os.stat(p)
    seen.update(mode=oct(stat.S_IMODE(st.st_mode)), uid=st.st_uid,
                writable=os.access('/run/secrets', os.W_OK))
print(json.dumps(seen), flush=True)
time.sleep(float(sys.argv[2]))
"""


def manager(state: Path, minion: str, image: str) -> WorkerManager:
    config = PodmanConfig(image=image, containers_conf=CONF, memory_mb=256, cpus=1, stop_grace_s=2)
    runtime = PodmanRuntime(config, minion)
    runtime.node_gpus = 2
    return WorkerManager(state, minion, Broker(), gpu_indices=[0, 1], runtime=runtime)  # type: ignore[arg-type]


def start(minion: str, gpu: int, args: list[str], **kw: Any) -> StartWorker:
    placement = uuid.uuid4().hex
    return StartWorker(
        minion_id=minion,
        job_id=f"job-{placement[:6]}",
        job_name="keys",
        worker=0,
        command=["python3", "-c", PROBE % {"digest": DIGEST}, *args],
        gpu_indices=[gpu],
        placement_id=placement,
        **kw,
    )


async def test_a_worker_sees_its_key_as_a_file_and_the_worker_beside_it_does_not(
    tmp_path: Path, minion: str, image: str
) -> None:
    state = tmp_path / "state"
    m = manager(state, minion, image)
    keys = {"huggingface": {"token": VALUE}}
    owner = start(minion, 0, ["/nowhere", "3"], attached_keys=keys)
    owner_file = m.worker_dir(owner.placement_id) / "secrets" / "huggingface" / "token"
    other = start(minion, 1, [str(owner_file), "0"])
    assert m.start(owner)
    secrets = m.worker_dir(owner.placement_id) / "secrets"
    if os.geteuid() == 0:  # the agent can mount: the key is in memory, not on the disk
        assert secrets.is_mount()
    spec = json.loads((m.worker_dir(owner.placement_id) / "spec.json").read_text())
    assert spec["key_types"] == ["huggingface"] and VALUE not in json.dumps(spec)
    await until_started(m, owner.placement_id)
    assert m.start(other)
    beside = await until_finished(m, other.placement_id)
    mine = await until_finished(m, owner.placement_id)

    assert (mine.state, mine.exit_code) == (WorkerState.finished, 0), mine.log_tail
    assert json.loads(mine.log_tail) == {
        "secrets_path": "/run/secrets",
        "file": DIGEST,
        "other": "FileNotFoundError",
        "in_env": False,
        "mode": "0o400",
        "uid": 10000,
        "writable": False,
    }
    assert (beside.state, beside.exit_code) == (WorkerState.finished, 0), beside.log_tail
    assert json.loads(beside.log_tail) == {
        "secrets_path": None,
        "file": "FileNotFoundError",  # no /run/secrets of its own
        "other": "FileNotFoundError",  # nor the host's path of the other's
        "in_env": False,
    }
    # ended: nothing of the key is left on the node
    assert not secrets.exists()  # unmounted and deleted
    files = [f for f in state.rglob("*") if f.is_file()]
    assert files and all(VALUE.encode() not in f.read_bytes() for f in files)
