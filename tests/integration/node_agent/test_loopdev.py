"""loopdev.py against the real kernel: an image mounted through a loop device by the agent's
own calls (no mount(8)), with the options a worker's disk needs, and no loop device left
behind, whether the mount is undone or never succeeds. Skipped where loop devices cannot be
had (not root, no loop driver)."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from gpufleet_node_agent.host import loopdev
from gpufleet_node_agent.steps import disk

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not loopdev.CONTROL.exists() or shutil.which("losetup") is None,
    reason="loop devices are unavailable (needs root and the loop driver)",
)
_libc = ctypes.CDLL(None, use_errno=True)


def backed_by(image: Path) -> list[str]:
    """Loop devices backed by `image`, as losetup lists them."""
    out = subprocess.run(
        ["losetup", "--noheadings", "--output", "NAME", "--associated", str(image)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.split()


def options(mountpoint: Path) -> set[str]:
    """The mount's options and its filesystem's (mountinfo's fields 6 and after the `-`)."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == str(mountpoint):
            return set(fields[5].split(",")) | set(fields[-1].split(","))
    return set()


@pytest.fixture
def image(tmp_path: Path) -> Path:
    made = disk.template(tmp_path / "templates", 1)
    assert isinstance(made, Path), made
    copy = tmp_path / "disk.img"
    disk.copy_sparse(made, copy)
    return copy


def test_an_image_is_mounted_nosuid_nodev_and_its_device_goes_with_the_unmount(
    image: Path, tmp_path: Path
) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    loopdev.mount(image, mnt, "ext4", disk.MOUNT_DATA)
    try:
        assert os.path.ismount(mnt)
        # nobarrier: no flush, which the loop device makes an fsync of the host's file
        assert {"nosuid", "nodev", "noatime", "rw", "nobarrier"} <= options(mnt)
        (mnt / "written").write_text("kept on the image")
        devices = backed_by(image)
        assert len(devices) == 1
        autoclear = Path(f"/sys/block/{Path(devices[0]).name}/loop/autoclear").read_text()
        assert autoclear.strip() == "1"
    finally:
        assert _libc.umount2(os.fsencode(mnt), 0) == 0
    assert backed_by(image) == []  # autoclear: detached with the unmount
    loopdev.mount(image, mnt, "ext4", disk.MOUNT_DATA)  # what was written is on the image
    try:
        assert (mnt / "written").read_text() == "kept on the image"
    finally:
        _libc.umount2(os.fsencode(mnt), 0)


def test_a_mount_that_fails_says_why_and_leaves_no_loop_device(tmp_path: Path) -> None:
    junk = tmp_path / "junk.img"
    with junk.open("wb") as f:
        f.truncate(2**24)  # zeros: no filesystem
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with pytest.raises(OSError) as err:
        loopdev.mount(junk, mnt, "ext4")
    assert "junk.img" in str(err.value)
    assert not os.path.ismount(mnt)
    assert backed_by(junk) == []


def test_many_mounts_at_once_each_get_their_own_device(image: Path, tmp_path: Path) -> None:
    """Free devices are asked for concurrently (other agents of the node): EBUSY is asked
    again, never two images on one device."""
    from concurrent.futures import ThreadPoolExecutor

    images, mounts = [], []
    for i in range(12):
        copy = tmp_path / f"d{i}.img"
        disk.copy_sparse(image, copy)
        mnt = tmp_path / f"m{i}"
        mnt.mkdir()
        images.append(copy)
        mounts.append(mnt)
    with ThreadPoolExecutor(6) as pool:
        list(pool.map(lambda pair: loopdev.mount(*pair, "ext4"), zip(images, mounts, strict=True)))
    try:
        devices = [backed_by(i) for i in images]
        assert all(len(d) == 1 for d in devices)
        assert len({d[0] for d in devices}) == len(images)
        for i, mnt in enumerate(mounts):
            (mnt / "who").write_text(str(i))
        assert [(m / "who").read_text() for m in mounts] == [str(i) for i in range(12)]
    finally:
        for mnt in mounts:
            _libc.umount2(os.fsencode(mnt), 0)
    assert all(backed_by(i) == [] for i in images)


def test_a_device_the_kernel_calls_free_but_someone_holds_is_passed_over(
    image: Path, tmp_path: Path
) -> None:
    """The kernel names an unbound device as free even while another process holds it (one
    being released after an unmount, say): configuring it is EBUSY however often it is
    asked (a benchmark run failed a job so after 50 quick tries). The mount then gets a
    new device."""
    import fcntl

    control = os.open(loopdev.CONTROL, os.O_RDWR)
    try:
        free = fcntl.ioctl(control, loopdev.LOOP_CTL_GET_FREE)
    finally:
        os.close(control)
    held = os.open(f"/dev/loop{free}", os.O_RDONLY | os.O_EXCL)  # claimed: EBUSY to others
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        loopdev.mount(image, mnt, "ext4", disk.MOUNT_DATA)
        try:
            (device,) = backed_by(image)
            assert device != f"/dev/loop{free}"
        finally:
            assert _libc.umount2(os.fsencode(mnt), 0) == 0
    finally:
        os.close(held)
    assert backed_by(image) == []
