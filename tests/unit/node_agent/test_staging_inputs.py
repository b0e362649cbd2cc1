"""The inputs step with the node's staging (steps/inputs.py): what a fetcher is given (the
worker's keys from its files, what is left of its disk, who hears its progress), a local
source skipped, and a fetch that fails failing the worker with its reason."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from gpufleet_contracts.jobs import Mount, MountKind
from gpufleet_contracts.locations import LocalSource, PlatformAsset, PlatformRef, S3Source, Source
from gpufleet_node_agent.staging.credentials import keys_of
from gpufleet_node_agent.staging.registry import Fetchers, Moved, Transfer
from gpufleet_node_agent.steps import keys as keyfiles
from gpufleet_node_agent.steps.base import WorkerFailed
from gpufleet_node_agent.steps.inputs import GIB, InputsStep
from gpufleet_node_agent.worker.files import write_json_atomic
from gpufleet_node_agent.worker.spec import WorkerSpec
from gpufleet_node_agent.worker.workdir import Worker


def worker(tmp_path: Path, *sources: Source, disk_size_gb: int = 1) -> Worker:
    mounts = tuple(
        Mount(target=f"/opt/ml/input/d{i}", kind=MountKind.input, source=s, env=f"D{i}")
        for i, s in enumerate(sources)
    )
    spec = WorkerSpec(
        placement_id="p",
        job_id="j",
        worker=0,
        command=("true",),
        mounts=mounts,
        disk_size_gb=disk_size_gb,
    )
    return Worker(spec, tmp_path)


async def test_a_fetcher_gets_the_keys_the_disk_left_and_the_mounts_progress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(keyfiles.os, "geteuid", lambda: 1000)  # no tmpfs, no chown
    write_json_atomic(
        tmp_path / keyfiles.KEYS_FILE, {"aws": {"access_key_id": "AK", "secret_access_key": "SK"}}
    )
    assert keyfiles.materialize(tmp_path, 1000) is None
    (tmp_path / "already.bin").write_bytes(b"x" * 1000)
    heard: list[tuple[str, Moved]] = []
    given: list[Transfer] = []

    async def fetch(source: Source, dest: Path, t: Transfer) -> None:
        given.append(t)
        t.progress(Moved(1, 2))
        (dest / "a.csv").write_text("a\n")

    w = worker(tmp_path, S3Source(url="s3://b/d.csv"))
    step = InputsStep(
        lambda w: [],
        Fetchers({"s3": fetch}),
        progress_for=lambda w, m: lambda moved: heard.append((m.target, moved)),
    )
    await step.setup(w)
    (t,) = given
    assert t.keys == {"aws": {"access_key_id": "AK", "secret_access_key": "SK"}}
    assert keys_of(tmp_path) == t.keys
    assert GIB - 1100 < t.limit_bytes <= GIB - 1000
    assert t.worker_dir == tmp_path
    assert heard == [("/opt/ml/input/d0", Moved(1, 2))]
    assert (tmp_path / "mnt/opt/ml/input/d0/a.csv").read_text() == "a\n"


async def test_a_failed_fetch_fails_the_worker_with_its_reason(tmp_path: Path) -> None:
    async def fetch(source: Source, dest: Path, t: Transfer) -> None:
        raise WorkerFailed("s3://b/d.csv not found")

    step = InputsStep(lambda w: [], Fetchers({"s3": fetch}))
    with pytest.raises(WorkerFailed, match=r"s3://b/d\.csv not found"):
        await step.setup(worker(tmp_path, S3Source(url="s3://b/d.csv")))
    with pytest.raises(WorkerFailed, match="this node cannot fetch platform sources"):
        await step.setup(worker(tmp_path, PlatformRef(asset=PlatformAsset.dataset, name="coco")))
    with pytest.raises(WorkerFailed, match="this node cannot fetch local sources"):
        await step.setup(worker(tmp_path, LocalSource(path="/data")))


async def test_an_earlier_tries_partial_fetch_is_emptied_first(tmp_path: Path) -> None:
    seen: list[list[str]] = []

    async def fetch(source: Source, dest: Path, t: Transfer) -> None:
        seen.append(sorted(e.name for e in os.scandir(dest)))

    w = worker(tmp_path, S3Source(url="s3://b/d/"))
    (tmp_path / "mnt/opt/ml/input/d0/sub").mkdir(parents=True)
    (tmp_path / "mnt/opt/ml/input/d0/half.part").write_bytes(b"x")
    await InputsStep(lambda w: [], Fetchers({"s3": fetch})).setup(w)
    assert seen == [[]]
