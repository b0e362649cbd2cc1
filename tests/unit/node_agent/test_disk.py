"""Node agent: a container worker's disk quota (disk.py) as plain data: sizes, argv, binds."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from gpufleet_node_agent.steps import disk
from gpufleet_node_agent.worker import spec as specs

WD = Path("/state/workers/pl-1")


def test_the_backing_file_is_disk_size_gb_in_decimal_gb_as_image_sizes_are() -> None:
    assert disk.size_bytes(10) == 10_000_000_000
    assert disk.size_bytes(1) == 1_000_000_000
    assert disk.size_bytes(0) == disk.GB  # one GB at least: an empty disk is no disk


def test_mkfs_makes_a_journal_less_ext4_with_no_reserved_blocks_and_lazy_inode_tables() -> None:
    argv = disk.mkfs_argv(WD / "disk.img")
    assert argv[0].endswith("mkfs.ext4")
    assert argv[1:] == [
        "-q", "-F", "-O", "^has_journal,^resize_inode", "-m", "0",
        "-E", "lazy_itable_init=1,nodiscard", "-L", "gpufleet-worker", f"{WD}/disk.img",
    ]  # fmt: skip


def test_the_mount_is_a_loop_mount_without_setuid_devices_or_background_zeroing() -> None:
    argv = disk.mount_argv(WD / "disk.img", WD / "disk")
    assert argv[0].endswith("mount")
    assert argv[1:] == [
        "-t", "ext4", "-o", "loop,nosuid,nodev,noatime,noinit_itable,nobarrier",
        f"{WD}/disk.img", f"{WD}/disk",
    ]  # fmt: skip


def test_the_writable_places_of_a_container_are_all_on_its_quota_filesystem() -> None:
    assert disk.binds(WD) == {
        "/opt/ml/output": WD / "disk/output",
        "/opt/ml/checkpoint": WD / "disk/checkpoint",
        "/tmp": WD / "disk/tmp",
        "/var/tmp": WD / "disk/var-tmp",
    }
    kept = {q.name: q.kept for q in disk.QUOTA_DIRS}
    # output and checkpoint are kept where the process runtime keeps them; tmp is not
    assert kept == {
        "output": "output",
        "checkpoint": "mnt/opt/ml/checkpoint",
        "tmp": None,
        "var-tmp": None,
    }


def test_release_is_quick_and_harmless_where_there_is_no_quota(tmp_path: Path) -> None:
    (tmp_path / "output").mkdir()
    disk.release(tmp_path)  # nothing mounted, no file: nothing to do
    assert sorted(p.name for p in tmp_path.iterdir()) == ["output"]


@pytest.mark.parametrize("size", [None, "absent"])
def test_a_spec_without_a_disk_size_gets_startworkers_default(
    size: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An older agent's spec.json without `disk_size_gb` (or null) reads as StartWorker's
    default, 10 GB, which the disk step sets up."""
    seen: list[list[str]] = []

    def run(argv: list[str], timeout: float = 0) -> str | None:
        seen.append(argv)
        return "stop here"

    old: dict[str, object] = {"placement_id": "p", "job_id": "j", "worker": 0, "command": ["x"]}
    if size is None:
        old["disk_size_gb"] = None
    (tmp_path / "spec.json").write_text(json.dumps(old))
    spec = specs.read(tmp_path)
    assert spec is not None and spec.disk_size_gb == 10
    monkeypatch.setattr(disk, "_run", run)
    error = disk.setup(tmp_path, spec.disk_size_gb, 10000)
    assert error is not None and "of 10 GB" in error
    assert not (tmp_path / "disk.img").exists()  # removed again on failure
    assert seen[0][0].endswith("mkfs.ext4")


def test_a_disk_bigger_than_the_nodes_free_space_is_refused(tmp_path: Path) -> None:
    error = disk.setup(tmp_path, 10**9, 10000)  # an exabyte
    assert error is not None and error.startswith("the node's disk has ")
    assert error.endswith("GB free, less than disk_size_gb 1000000000")
    assert not (tmp_path / "disk.img").exists()


def test_release_copies_only_what_the_job_left_and_unmounts_without_a_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 15: an empty output/ or checkpoint/ costs no `cp`; the unmount is umount(2).
    What is kept is the outputs step's teardown, the release the disk step's, after it."""
    mountpoint = tmp_path / "disk"
    for name in ("output", "checkpoint", "tmp", "var-tmp"):
        (mountpoint / name).mkdir(parents=True)
    (mountpoint / "checkpoint" / "step-1").write_text("w")
    (mountpoint / "tmp" / "scratch").write_text("dropped")
    (tmp_path / "disk.img").write_bytes(b"")
    ran: list[list[str]] = []
    unmounted: list[tuple[Path, int]] = []

    def run(argv: list[str], timeout: float = 0) -> str | None:
        ran.append(argv)
        return None

    def umount2(path: Path, flags: int = 0) -> str | None:
        unmounted.append((path, flags))
        return None

    monkeypatch.setattr(disk, "_run", run)
    monkeypatch.setattr(disk, "_umount2", umount2)
    monkeypatch.setattr(disk.os.path, "ismount", lambda p: Path(p) == mountpoint)
    disk.keep(tmp_path, disk.to_keep(tmp_path))
    disk.release(tmp_path)
    assert [a[-2] for a in ran] == [f"{mountpoint / 'checkpoint'}/."]  # one cp, not four
    assert unmounted == [(mountpoint, 0)]
    assert not (tmp_path / "disk.img").exists()


def test_each_workers_disk_is_a_copy_of_the_nodes_template_formatted_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[str] = []

    def run(argv: list[str], timeout: float = 0) -> str | None:
        ran.append(Path(argv[0]).name)
        if argv[0].endswith("mkfs.ext4"):
            with open(argv[-1], "r+b") as f:  # what a format writes, here and there
                f.write(b"superblock")
                f.seek(3 * 2**20)
                f.write(b"group table")
        return None

    def mount(image: Path, mountpoint: Path) -> str | None:
        ran.append("mount")
        return None

    monkeypatch.setattr(disk, "_run", run)
    monkeypatch.setattr(disk, "mount", mount)
    workers = tmp_path / "state" / "workers"
    for placement in ("p1", "p2"):
        (workers / placement).mkdir(parents=True)
        assert disk.setup(workers / placement, 2, os.getuid()) is None
    assert ran == ["mkfs.ext4", "mount", "mount"]  # one format for the node, a mount each
    [made] = (tmp_path / "state" / disk.TEMPLATES).iterdir()
    assert made.name.startswith("2gb-") and made.stat().st_mode & 0o777 == 0o600
    for placement in ("p1", "p2"):
        image = workers / placement / disk.IMAGE
        assert image.stat().st_size == disk.size_bytes(2)
        assert image.stat().st_mode & 0o777 == 0o600
        with image.open("rb") as f:
            assert f.read(10) == b"superblock"
            f.seek(3 * 2**20)
            assert f.read(11) == b"group table"
        assert image.stat().st_blocks * 512 < 2**20  # sparse: the data ranges only


def test_a_template_whose_format_failed_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(disk, "_run", lambda argv, timeout=0: "mkfs.ext4 failed (1): no")
    assert disk.template(tmp_path / "t", 1) == "mkfs.ext4 failed (1): no"
    assert list((tmp_path / "t").iterdir()) == []


def test_a_sparse_copy_keeps_the_data_and_the_holes(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    with src.open("wb") as f:
        f.truncate(64 * 2**20)
        f.write(b"a" * 4096)
        f.seek(40 * 2**20)
        f.write(b"b" * 8192)
    disk.copy_sparse(src, dst)
    assert dst.read_bytes() == src.read_bytes()
    assert dst.stat().st_blocks <= src.stat().st_blocks + 64
    with pytest.raises(FileExistsError):  # never over a file that is there
        disk.copy_sparse(src, dst)


def test_a_kernel_without_loop_configure_gets_mount8_from_then_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []

    def unsupported(*args: object) -> None:
        calls.append("loopdev")
        raise disk.loopdev.Unsupported("LOOP_CONFIGURE is not supported (Linux < 5.8)")

    def run(argv: list[str], timeout: float = 0) -> str | None:
        calls.append(Path(argv[0]).name)
        return None

    monkeypatch.setattr(disk.loopdev, "mount", unsupported)
    monkeypatch.setattr(disk, "_run", run)
    monkeypatch.setattr(disk, "_loop_calls", True)
    assert disk.mount(tmp_path / "disk.img", tmp_path / "disk") is None
    assert disk.mount(tmp_path / "disk.img", tmp_path / "disk") is None
    assert calls == ["loopdev", "mount", "mount"]  # asked once, then mount(8)


def test_a_mount_the_kernel_refuses_is_the_workers_error_not_a_fallback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(*args: object) -> None:
        raise OSError(22, "mount of disk.img: Invalid argument")

    monkeypatch.setattr(disk.loopdev, "mount", refused)
    monkeypatch.setattr(disk, "_run", lambda argv, timeout=0: "mount(8) must not be asked")
    monkeypatch.setattr(disk, "_loop_calls", True)
    assert disk.mount(tmp_path / "disk.img", tmp_path / "disk") == (
        "[Errno 22] mount of disk.img: Invalid argument"
    )


async def test_a_checkpoint_is_filled_on_the_quota_filesystem_where_the_container_sees_it(
    tmp_path: Path,
) -> None:
    """/opt/ml/checkpoint is bound from the quota filesystem: a checkpoint fetched into the
    worker's mnt/ would be hidden under that bind. The inputs and models stay in mnt/."""
    from gpufleet_contracts.jobs import Mount, MountKind
    from gpufleet_contracts.locations import PlatformAsset, PlatformRef, Source
    from gpufleet_node_agent.runtimes.podman import PodmanRuntime
    from gpufleet_node_agent.runtimes.podman_args import PodmanConfig, quota_binds
    from gpufleet_node_agent.staging.registry import Fetchers, Transfer
    from gpufleet_node_agent.steps.inputs import InputsStep
    from gpufleet_node_agent.worker.workdir import Worker

    w = tmp_path / "w"
    assert disk.filled_at(w, "/opt/ml/checkpoint") == w / "disk/checkpoint"
    assert disk.filled_at(w, "/opt/ml/checkpoint/My_Ck") == w / "disk/checkpoint/My_Ck"
    assert disk.filled_at(w, "/opt/ml/checkpoint/../x") == w / "disk/checkpoint/x"
    assert disk.filled_at(w, "/opt/ml/checkpointed") == w / "mnt/opt/ml/checkpointed"
    assert disk.filled_at(w, "/opt/ml/input/coco") == w / "mnt/opt/ml/input/coco"
    assert disk.filled_at(w, "/opt/ml/models") == w / "mnt/opt/ml/models"
    seen = {b.target: b.host for b in quota_binds(w)}
    assert seen["/opt/ml/checkpoint"] == disk.filled_at(w, "/opt/ml/checkpoint")
    assert seen["/opt/ml/models"] == disk.filled_at(w, "/opt/ml/models")

    async def fetch(source: Source, dest: Path, t: Transfer) -> None:
        (dest / "step.txt").write_text("41\n")

    fetchers = Fetchers({"platform": fetch})
    ck = PlatformRef(asset=PlatformAsset.checkpoint, name="ck")
    mounts = (Mount(target="/opt/ml/checkpoint", kind=MountKind.checkpoint, source=ck),)
    worker = Worker(specs.WorkerSpec(placement_id="p", job_id="j", worker=0, mounts=mounts), w)
    for quota, at in ((True, "disk/checkpoint"), (False, "mnt/opt/ml/checkpoint")):
        config = PodmanConfig(image="localhost/none", disk_quota=quota)
        runtime = PodmanRuntime(config, "m1", fetchers=fetchers)
        (inputs,) = [s for s in runtime.steps if isinstance(s, InputsStep)]
        await inputs.setup(worker)
        assert (w / at / "step.txt").read_text() == "41\n"
