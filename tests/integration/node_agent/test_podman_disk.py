"""A container worker's disk quota of disk_size_gb (disk.py) against real podman and real
loop mounts: beyond it a job gets ENOSPC, within it it succeeds, and when the worker ends
its filesystem is unmounted and its file deleted, its output kept. Skipped only where
podman is missing or loop devices cannot be had (not root, or no loop driver)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from gpufleet_contracts.jobs import WorkerState
from gpufleet_node_agent.steps import disk

from .podman_support import until_finished, until_started
from .test_podman_runtime import manager, start


def _loop_devices() -> bool:
    if os.geteuid() != 0 or shutil.which("losetup") is None:
        return False
    return subprocess.run(["losetup", "-f"], capture_output=True, check=False).returncode == 0


pytestmark = pytest.mark.skipif(
    shutil.which("podman") is None or not _loop_devices(),
    reason="podman is not installed or loop devices are unavailable (needs root)",
)

FILL = """
import errno, json, os
out = {'total': os.statvfs('/opt/ml/output').f_blocks * os.statvfs('/opt/ml/output').f_frsize}
try:
    open('/in-the-image-root', 'w')
except OSError as e:
    out['root'] = e.strerror
written = 0
try:
    with open('/opt/ml/output/big', 'wb') as f:
        chunk = b'x' * 2**24
        for _ in range(%(chunks)d):
            f.write(chunk); f.flush(); written += len(chunk)
        os.fsync(f.fileno())
except OSError as e:
    out['error'] = e.strerror
out['written'] = written
try:
    open('/tmp/more', 'wb').write(b'y' * 2**24)
except OSError as e:
    out['tmp_error'] = e.strerror
print(json.dumps(out), flush=True)
raise SystemExit(3 if 'error' in out else 0)
"""


def mounted(wd: Path) -> bool:
    return os.path.ismount(wd / "disk")


def gone(wd: Path) -> None:
    """The worker's filesystem is unmounted, its file deleted, no loop device left on it."""
    assert not mounted(wd)
    assert not (wd / "disk.img").exists() and not (wd / "disk").exists()
    loops = subprocess.run(["losetup", "-a"], capture_output=True, text=True, check=False)
    assert str(wd) not in loops.stdout


async def test_writing_beyond_disk_size_gb_fails_in_the_job_with_enospc(
    tmp_path: Path, minion: str, image: str
) -> None:
    m = manager(tmp_path / "state", minion, image)
    cmd = start(minion, FILL % {"chunks": 96}, disk_size_gb=1)  # 1.5 GiB into 1 GB
    m.start(cmd)
    done = await until_finished(m, cmd.placement_id, within=120)
    assert (done.state, done.exit_code) == (WorkerState.failed, 3), done.log_tail
    seen = json.loads(done.log_tail)
    assert seen["error"] == seen["tmp_error"] == "No space left on device"
    assert seen["root"] == "Read-only file system"
    assert 0.9 * disk.GB < seen["total"] <= disk.GB  # its whole disk, metadata apart
    assert seen["written"] <= disk.GB
    wd = m.worker_dir(cmd.placement_id)
    gone(wd)
    kept = (wd / "output" / "big").stat().st_size  # what it wrote is kept, no more
    assert 0.9 * disk.GB < kept <= disk.GB


async def test_a_job_within_its_quota_succeeds_and_its_disk_is_released(
    tmp_path: Path, minion: str, image: str
) -> None:
    m = manager(tmp_path / "state", minion, image)
    cmd = start(minion, FILL % {"chunks": 4}, disk_size_gb=1)
    m.start(cmd)
    await until_started(m, cmd.placement_id)
    wd = m.worker_dir(cmd.placement_id)
    done = await until_finished(m, cmd.placement_id)
    assert (done.state, done.exit_code) == (WorkerState.finished, 0), done.log_tail
    assert json.loads(done.log_tail)["written"] == 4 * 2**24
    gone(wd)
    big = wd / "output" / "big"
    assert (big.stat().st_size, big.stat().st_uid) == (4 * 2**24, 10000)
    assert not (wd / "mnt" / "opt" / "ml" / "checkpoint" / "more").exists()


async def test_after_an_agent_restart_the_disk_is_still_released_when_the_worker_ends(
    tmp_path: Path, minion: str, image: str
) -> None:
    state = tmp_path / "state"
    first = manager(state, minion, image)
    code = (
        "import time; open('/opt/ml/checkpoint/ck', 'w').write('step 1');"
        "print('begin', flush=True); time.sleep(3); print('end')"
    )
    cmd = start(minion, code, disk_size_gb=2)
    first.start(cmd)
    await until_started(first, cmd.placement_id)
    wd = first.worker_dir(cmd.placement_id)
    assert mounted(wd)
    assert (wd / "disk.img").stat().st_size == 2 * disk.GB
    assert (wd / "disk.img").stat().st_blocks * 512 < 64 * 2**20  # sparse: what is written
    second = manager(state, minion, image)  # the agent restarted; the mount is the host's
    assert second.recover().reattached == [cmd.placement_id]
    done = await until_finished(second, cmd.placement_id)
    assert (done.state, done.log_tail) == (WorkerState.finished, "begin\nend\n")
    gone(wd)
    assert (wd / "mnt" / "opt" / "ml" / "checkpoint" / "ck").read_text() == "step 1"


LOOK = """
import os
print(sorted(os.listdir('/tmp')), sorted(os.listdir('/opt/ml/output')), flush=True)
open('/tmp/left-by-%(n)s', 'w').write('secret'); open('/opt/ml/output/out-%(n)s', 'w').write('x')
"""


async def test_each_worker_gets_an_empty_disk_though_all_are_copies_of_one_template(
    tmp_path: Path, minion: str, image: str
) -> None:
    """disk.template: one format per node and size; what one worker wrote on its disk is
    never on the next one's (each a copy of the never-mounted template)."""
    m = manager(tmp_path / "state", minion, image)
    for n in (1, 2):
        cmd = start(minion, LOOK % {"n": n}, disk_size_gb=1)
        m.start(cmd)
        done = await until_finished(m, cmd.placement_id)
        assert (done.state, done.log_tail) == (WorkerState.finished, "[] []\n")
        assert (m.worker_dir(cmd.placement_id) / "output" / f"out-{n}").exists()  # kept
    [template] = (tmp_path / "state" / disk.TEMPLATES).iterdir()
    assert template.name.startswith("1gb-")
