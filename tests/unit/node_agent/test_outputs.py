"""A worker's output (steps/outputs.py, steps/outzip.py): zipped with its manifest within its
disk budget, symlinks left out, put by the node's uploader for its target's kind while the
worker is reported `uploading`; a failed put fails the worker and keeps the archive on the
node; one worker's upload never holds another's report. Real bare processes (ProcessRuntime)
and a real uploader to a local directory; the broker only records what is published."""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import sys
import time
import zipfile
from pathlib import Path

from gpufleet_contracts.jobs import (
    Mount,
    MountKind,
    WorkerFinished,
    WorkerStaging,
    WorkerState,
    WorkerUploading,
)
from gpufleet_contracts.locations import LocalSource, OutputTarget, WebSource
from gpufleet_node_agent.runtimes.process import ProcessRuntime
from gpufleet_node_agent.staging.registry import Moved, Transfer, Uploaders
from gpufleet_node_agent.steps import outzip
from gpufleet_node_agent.steps.base import WorkerFailed
from gpufleet_node_agent.steps.outputs import prune_kept
from gpufleet_node_agent.worker.manager import WorkerManager
from gpufleet_node_agent.worker.progress import progress_for
from gpufleet_node_agent.worker.spec import WorkerSpec
from gpufleet_node_agent.worker.workdir import Worker

from .test_workers import FakeBroker, cmd, finished, until

PY = sys.executable


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_the_archive_holds_every_file_and_a_manifest_sha256sum_reads(tmp_path: Path) -> None:
    out = tmp_path / "output"
    (out / "model" / "weights").mkdir(parents=True)
    (out / "metrics.json").write_text('{"loss": 0.1}')
    (out / "model" / "weights" / "w.bin").write_bytes(os.urandom(300_000))
    (out / "empty").mkdir()
    dest = tmp_path / "up" / "train_1.zip"
    size = outzip.archive(out, dest, 10**9)
    assert size == dest.stat().st_size
    with zipfile.ZipFile(dest) as zf:
        assert sorted(zf.namelist()) == [
            "MANIFEST.sha256",
            "metrics.json",
            "model/weights/w.bin",
        ]
        manifest = zf.read("MANIFEST.sha256").decode()
        metrics, weights = (out / "metrics.json").read_bytes(), (out / "model/weights/w.bin")
        assert manifest == (
            f"{sha(metrics)}  metrics.json\n{sha(weights.read_bytes())}  model/weights/w.bin\n"
        )
    assert outzip.verify(dest) == []
    # and sha256sum itself agrees, on the files unpacked
    unpacked = tmp_path / "unpacked"
    shutil.unpack_archive(dest, unpacked)
    if shutil.which("sha256sum"):
        import subprocess

        subprocess.run(["sha256sum", "--quiet", "-c", "MANIFEST.sha256"], cwd=unpacked, check=True)


def test_symlinks_are_not_followed_nor_stored(tmp_path: Path) -> None:
    secret = tmp_path / "node-secret"
    secret.write_text("the node's own file")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "big.bin").write_text("not the job's")
    out = tmp_path / "output"
    out.mkdir()
    (out / "real.txt").write_text("mine")
    (out / "link.txt").symlink_to(secret)
    (out / "dir-link").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (out / "MANIFEST.sha256").write_text("a job's own manifest is not ours\n")
    dest = tmp_path / "out.zip"
    outzip.archive(out, dest, 10**6)
    with zipfile.ZipFile(dest) as zf:
        assert sorted(zf.namelist()) == ["MANIFEST.sha256", "real.txt"]
        assert b"node's own" not in b"".join(zf.read(n) for n in zf.namelist())
    assert outzip.verify(dest) == []


def test_an_output_past_the_disk_budget_fails_and_leaves_no_archive(tmp_path: Path) -> None:
    out = tmp_path / "output"
    out.mkdir()
    (out / "noise.bin").write_bytes(os.urandom(3 * 1024 * 1024))  # incompressible
    dest = tmp_path / "out.zip"
    try:
        outzip.archive(out, dest, 1024 * 1024)
    except WorkerFailed as exc:
        assert "too large" in exc.reason and "1048576 bytes" in exc.reason
    else:
        raise AssertionError("an archive past its budget was made")
    assert not dest.exists()
    outzip.archive(out, dest, 4 * 1024 * 1024)  # within it: made
    assert outzip.verify(dest) == []


def test_verify_finds_a_file_that_is_not_as_its_manifest_says(tmp_path: Path) -> None:
    out = tmp_path / "output"
    out.mkdir()
    (out / "a.txt").write_text("a")
    dest = tmp_path / "out.zip"
    outzip.archive(out, dest, 10**6)
    with zipfile.ZipFile(dest, "a") as zf:
        zf.writestr("b.txt", "smuggled")
    assert outzip.verify(dest) == ["b.txt: not as its manifest says"]


class ToDirectory:
    """A real uploader to a `local` target: the archive copied into the target's directory
    (a cut-short try's file is written over), its progress told, its size read back."""

    def __init__(self, fail: str | None = None, hold: asyncio.Event | None = None) -> None:
        self.fail, self.hold = fail, hold
        self.put: list[tuple[str, Transfer]] = []

    async def __call__(self, path: Path, target: OutputTarget, t: Transfer) -> None:
        assert isinstance(target, LocalSource)
        self.put.append((path.name, t))
        if self.hold is not None:
            await self.hold.wait()
        if self.fail is not None:
            raise WorkerFailed(self.fail)
        dest = Path(target.path) / path.name
        size = (await asyncio.to_thread(path.stat)).st_size
        t.progress(Moved(0, size))
        await asyncio.to_thread(shutil.copyfile, path, dest)
        t.progress(Moved(size, size))
        if (await asyncio.to_thread(dest.stat)).st_size != size:
            raise WorkerFailed("the copy is not the archive's size")


def writes_output(text: str = "weights") -> list[str]:
    code = f"import os; open(os.environ['ML_OUTPUT_PATH'] + '/model.txt', 'w').write({text!r})"
    return [PY, "-c", code]


def manager(tmp_path: Path, broker: FakeBroker, uploader: ToDirectory) -> WorkerManager:
    uploaders = Uploaders({"local": uploader})
    rt = ProcessRuntime(uploaders=uploaders)
    return WorkerManager(tmp_path / "state", "m1", broker, gpu_indices=[0, 1], runtime=rt)


async def test_the_output_is_zipped_and_put_while_the_worker_is_uploading(tmp_path: Path) -> None:
    target = tmp_path / "bucket"
    target.mkdir()
    broker, uploader = FakeBroker(), ToDirectory()
    m = manager(tmp_path, broker, uploader)
    m.start(
        cmd(
            command=writes_output(),
            output=LocalSource(path=str(target)),
            output_archive="train_1.zip",
            worker=1,
        )
    )
    evt = await finished(m, broker, "pl-1")
    assert evt.state is WorkerState.finished and evt.reason is None
    with zipfile.ZipFile(target / "train_1.zip") as zf:
        assert zf.read("model.txt") == b"weights"
        assert zf.read("MANIFEST.sha256").decode() == f"{sha(b'weights')}  model.txt\n"
    ((name, t),) = uploader.put
    assert name == "train_1.zip" and t.limit_bytes == 10 * 10**9 and t.keys == {}
    # reported uploading before finished, once
    types = [h["ce-type"] for _, _, h in broker.sent]
    assert types.count(WorkerUploading.TYPE) == 1
    assert types.index(WorkerUploading.TYPE) < types.index(WorkerFinished.TYPE)
    d = m.worker_dir("pl-1")
    assert (d / "uploaded").exists() and not (d / "upload").exists()
    staged = broker.events(WorkerStaging)
    assert staged and staged[0].items[0].name == "train_1.zip"
    assert staged[0].items[0].direction == "upload" and staged[0].items[0].names == str(target)


async def test_a_failed_upload_fails_the_worker_and_keeps_the_archive(tmp_path: Path) -> None:
    target = tmp_path / "bucket"
    target.mkdir()
    broker, uploader = FakeBroker(), ToDirectory(fail="access denied")
    m = manager(tmp_path, broker, uploader)
    m.start(
        cmd(command=writes_output(), output=LocalSource(path=str(target)), output_archive="t.zip")
    )
    evt = await finished(m, broker, "pl-1")
    kept = tmp_path / "state" / "kept-outputs" / m.worker_dir("pl-1").name
    assert evt.state is WorkerState.failed and evt.exit_code == 0
    assert evt.reason == (
        f"output upload to {target}: access denied (the archive is kept on the node in {kept})"
    )
    assert outzip.verify(kept / "t.zip") == [] and not list(target.iterdir())
    # kept for its time, then pruned
    assert prune_kept(tmp_path / "state", 3600) == []
    assert prune_kept(tmp_path / "state", 3600, now=time.time() + 3601) == [kept.name]
    assert not kept.exists()


async def test_without_a_target_or_an_uploader_for_its_kind_nothing_is_zipped(
    tmp_path: Path,
) -> None:
    broker, uploader = FakeBroker(), ToDirectory()
    m = manager(tmp_path, broker, uploader)
    m.start(cmd("pl-1", command=writes_output()))
    m.start(cmd("pl-2", command=writes_output(), output=LocalSource(path="/"), worker=1))
    m2 = manager(tmp_path / "other", broker, uploader)
    m2.start(cmd("pl-3", command=writes_output(), output=LocalSource(path=str(tmp_path))))
    assert (await finished(m, broker, "pl-1")).state is WorkerState.finished
    assert (await finished(m, broker, "pl-2")).state is WorkerState.finished
    assert len(uploader.put) == 1  # pl-2's: a target, and this node takes `local`
    # no uploader for the kind: nothing zipped, the worker finishes as its command did
    m3 = WorkerManager(tmp_path / "s3", "m1", broker, gpu_indices=[0], runtime=ProcessRuntime())
    m3.start(cmd("pl-4", command=writes_output(), output=LocalSource(path=str(tmp_path))))
    assert (await finished(m3, broker, "pl-4")).state is WorkerState.finished
    assert not (m3.worker_dir("pl-4") / "upload").exists()
    assert broker.events(WorkerUploading) == [
        e for e in broker.events(WorkerUploading) if e.placement_id == "pl-2"
    ]


async def test_one_workers_upload_never_holds_anothers_end(tmp_path: Path) -> None:
    hold = asyncio.Event()
    target = tmp_path / "bucket"
    target.mkdir()
    broker, uploader = FakeBroker(), ToDirectory(hold=hold)
    m = manager(tmp_path, broker, uploader)
    m.start(cmd("pl-slow", command=writes_output(), output=LocalSource(path=str(target))))
    await until(m, lambda: bool(uploader.put))  # its upload has begun, and waits
    await until(m, lambda: bool(broker.events(WorkerUploading)))
    m.start(cmd("pl-quick", command=[PY, "-c", "pass"], worker=1))
    quick = await finished(m, broker, "pl-quick")
    assert quick.state is WorkerState.finished
    assert not [e for e in broker.events(WorkerFinished) if e.placement_id == "pl-slow"]
    hold.set()
    slow = await finished(m, broker, "pl-slow")
    assert slow.state is WorkerState.finished and (target / "job-1.zip").exists()


async def test_an_agent_restarted_mid_upload_puts_the_output_again(tmp_path: Path) -> None:
    hold = asyncio.Event()
    target = tmp_path / "bucket"
    target.mkdir()
    broker, first = FakeBroker(), ToDirectory(hold=hold)
    m = manager(tmp_path, broker, first)
    m.start(cmd(command=writes_output(), output=LocalSource(path=str(target))))
    await until(m, lambda: bool(first.put))
    # the agent dies while it puts: its task gone with it, nothing reported finished
    tearing = m.active["pl-1"].tearing
    assert tearing is not None
    tearing.cancel()
    again = ToDirectory()
    m2 = manager(tmp_path, broker, again)
    found = m2.recover()
    assert found.finished == ["pl-1"]
    evt = await finished(m2, broker, "pl-1")
    assert evt.state is WorkerState.finished and [n for n, _ in again.put] == ["job-1.zip"]
    with zipfile.ZipFile(target / "job-1.zip") as zf:
        assert zf.read("model.txt") == b"weights"


def test_a_staging_item_names_its_location_without_credentials_or_query(tmp_path: Path) -> None:
    src = WebSource(url="https://user:pw@data.example/sets/train.tar?X-Amz-Signature=abc#x")
    mount = Mount(target="/opt/ml/input/train", kind=MountKind.input, source=src)
    spec = WorkerSpec(placement_id="p", job_id="j", worker=0, command=("true",), mounts=(mount,))
    w = Worker(spec, tmp_path)
    told = progress_for(w, mount)
    (item,) = w.staging.values()
    assert item.names == "https://data.example/sets/train.tar" and item.kind == "web"
    assert item.state == "pending" and w.staging_seq == 1
    told(Moved(500, 1000))
    assert w.staging["/opt/ml/input/train"].state == "fetching"
    assert w.staging["/opt/ml/input/train"].done == 500
    told(Moved(1000, 1000))
    assert w.staging["/opt/ml/input/train"].state == "done" and w.staging_seq == 3
