"""The node's datastore mounts with real mounts and real directories (the bind adapter: this
machine's kernel has no NFS or SMB client, so its share is a local directory bind-mounted in
its place): a worker's datastore mounted and its file fetched to /opt/ml/input; the share
gone (a server that stopped answering) seen in one probe round, shown as the waiting reason,
and mounted again when it is back, without a new keeper (an agent restart); a share replaced
under the mount (a stale handle) mounted again; a probe that hangs killed in time."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from gpufleet_contracts.datastores import DatastoreMount
from gpufleet_contracts.jobs import Mount, MountKind, StagingState
from gpufleet_contracts.locations import DatastoreRef
from gpufleet_node_agent.mounts.bind import BindMounter
from gpufleet_node_agent.mounts.keeper import DatastoreMounts
from gpufleet_node_agent.mounts.port import NoDatastore, bounded, is_mounted, lazy_unmount
from gpufleet_node_agent.staging.datastores import Datastores
from gpufleet_node_agent.staging.registry import Fetchers
from gpufleet_node_agent.steps.base import WorkerFailed
from gpufleet_node_agent.steps.datastores import DatastoresStep
from gpufleet_node_agent.steps.inputs import InputsStep
from gpufleet_node_agent.worker.layout import mount_dir
from gpufleet_node_agent.worker.progress import progress_for, track
from gpufleet_node_agent.worker.spec import WorkerSpec
from gpufleet_node_agent.worker.workdir import Worker

SPEC = DatastoreMount(
    name="nas", region_id="acct/lab", type="nfs", address="10.0.0.5", root_path="/export/dir2"
)


def can_mount(tmp: Path) -> bool:
    a, b = tmp / "probe-a", tmp / "probe-b"
    a.mkdir()
    b.mkdir()
    ok = os.system(f"mount --bind {a} {b} 2>/dev/null") == 0
    if ok:
        os.system(f"umount {b}")
    return ok


@pytest.fixture
async def keeper(tmp_path: Path) -> AsyncIterator[tuple[DatastoreMounts, Path]]:
    if os.geteuid() != 0 or not can_mount(tmp_path):
        pytest.skip("bind mounts need root (CAP_SYS_ADMIN)")
    share = tmp_path / "shares" / SPEC.address / "export" / "dir2"

    async def ask(name: str) -> DatastoreMount:
        if name != "nas":
            raise NoDatastore(f"datastore {name} not found in this node's region")
        return SPEC

    mounts = DatastoreMounts(
        BindMounter(tmp_path / "shares", timeout_s=2.0),
        tmp_path / "state" / "datastores",
        ask,
        lambda sealed: "",
    )
    try:
        yield mounts, share
    finally:
        for h in list(mounts.held.values()):
            await lazy_unmount(h.at, 5.0)


def put(share: Path, text: str) -> None:
    (share / "sub").mkdir(parents=True)
    (share / "sub" / "data.txt").write_text(text)


async def test_a_mount_healed_when_its_server_goes_away_and_comes_back(
    keeper: tuple[DatastoreMounts, Path],
) -> None:
    mounts, share = keeper
    put(share, "first")
    at = await mounts.hold("nas", "w1")
    assert is_mounted(at) and (at / "sub" / "data.txt").read_text() == "first"
    assert mounts.roots["nas"] == at and mounts.reason("nas") is None

    # the server goes away: seen by the next round (bounded), shown as the reason
    shutil.move(share, share.with_name("gone"))
    began = time.monotonic()
    await mounts.heal()
    assert time.monotonic() - began < 10
    assert mounts.reason("nas") == "datastore nas unreachable"
    assert "nas" not in mounts.roots and not is_mounted(at)
    await mounts.heal()  # still gone: still unreachable, nothing piles up
    assert mounts.reason("nas") == "datastore nas unreachable"

    # it is back (another directory: what a server restarted with): mounted again
    put(share, "second")
    await mounts.heal()
    assert mounts.reason("nas") is None and is_mounted(at)
    assert (mounts.roots["nas"] / "sub" / "data.txt").read_text() == "second"

    # a stale handle: the share replaced while mounted (the mount still shows the old one)
    shutil.move(share, share.with_name("old"))
    put(share, "third")
    assert (at / "sub" / "data.txt").read_text() == "second"
    await mounts.heal()
    assert (at / "sub" / "data.txt").read_text() == "third"

    await mounts.release("nas", "w1")
    await mounts.release("nas", "w1")  # twice: nothing more
    assert not is_mounted(at) and "nas" not in mounts.roots


def worker(tmp_path: Path, ref: DatastoreRef) -> Worker:
    spec = WorkerSpec(
        placement_id="p",
        job_id="j",
        worker=0,
        command=("true",),
        mounts=(Mount(target="/opt/ml/input/data", kind=MountKind.input, source=ref, env="D"),),
        disk_size_gb=1,
    )
    (tmp_path / "w").mkdir(parents=True)
    return Worker(spec, tmp_path / "w")


async def test_a_worker_waits_for_its_datastore_then_reads_it_at_opt_ml_input(
    keeper: tuple[DatastoreMounts, Path], tmp_path: Path
) -> None:
    mounts, share = keeper
    w = worker(tmp_path, DatastoreRef(datastore="nas", path="/sub/data.txt"))
    step = DatastoresStep(mounts, track, wait_s=30, poll_s=0.05)
    setup = asyncio.create_task(step.setup(w))
    for _ in range(200):
        waiting = [i for i in w.staging.values() if i.state is StagingState.waiting]
        if waiting:
            break
        await asyncio.sleep(0.05)
    assert [i.reason for i in waiting] == ["datastore nas unreachable"]
    assert not setup.done()

    put(share, "input bytes")  # the server answers again
    await asyncio.wait_for(setup, 10)
    assert w.staging["datastore nas"].state is StagingState.done

    # the inputs step fetches from the mounted root: the job's file at /opt/ml/input
    fetchers = Fetchers({"datastore": Datastores(mounts.roots, "lab").fetch})
    inputs = InputsStep(
        lambda w: [mount_dir(w.dir, m.target) for m in w.spec.mounts],
        fetchers,
        progress_for=progress_for,
    )
    await inputs.setup(w)
    fetched = mount_dir(w.dir, "/opt/ml/input/data") / "data.txt"
    assert fetched.read_text() == "input bytes"

    await step.teardown(w)
    await step.teardown(w)  # twice-safe
    assert mounts.held == {}


async def test_a_worker_fails_for_a_datastore_its_region_lacks_or_that_never_answers(
    keeper: tuple[DatastoreMounts, Path], tmp_path: Path
) -> None:
    mounts, _ = keeper
    step = DatastoresStep(mounts, track, wait_s=0.3, poll_s=0.05)
    with pytest.raises(WorkerFailed, match="datastore other not found"):
        await step.setup(worker(tmp_path / "a", DatastoreRef(datastore="other", path="/")))
    with pytest.raises(WorkerFailed, match=r"datastore nas unreachable \(waited 0 s\)"):
        await step.setup(worker(tmp_path / "b", DatastoreRef(datastore="nas", path="/")))


async def test_a_probe_that_hangs_is_killed_in_time() -> None:
    began = time.monotonic()
    ran = await bounded(["sleep", "30"], 0.5)
    assert ran.timed_out and time.monotonic() - began < 3
