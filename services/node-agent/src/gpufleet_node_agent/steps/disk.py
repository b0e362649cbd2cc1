"""A container worker's disk quota of `disk_size_gb` (issue 14), on a filesystem without
project quotas (ext4 here, where podman's `--storage-opt size=` is refused).

Each worker gets its own small filesystem: a sparse file `disk.img` of `disk_size_gb`
(decimal GB, as podman counts image sizes) in its directory, formatted ext4 (no journal, no
reserved blocks) and loop-mounted (nosuid, nodev; by the agent's own calls, loopdev.py) at
`disk/`. The format is made once per
node and size, a **template** (`<state_dir>/disk-templates/`, never mounted), and each
worker's file is a sparse copy of it (the ~0.2 MB it holds): a fresh, empty filesystem
without a `mkfs` process per worker (issue 15: mkfs was ~12 ms of CPU a worker, the copy
~2). The container's only writable
places are on it: `disk/output` at /opt/ml/output, `disk/checkpoint` at /opt/ml/checkpoint,
`disk/tmp` at /tmp (also HOME) and `disk/var-tmp` at /var/tmp; its image's root is mounted
read-only (`--read-only`). A write beyond the quota fails in the job with ENOSPC; the host's
filesystem only ever holds what the job wrote (the file is sparse), never more than the quota.

When the worker has ended (its container gone), `keep` copies what it left in output/ and
checkpoint/ (an empty one costs no `cp`) to the worker directory's own `output/` and
`mnt/opt/ml/checkpoint/` (where the process runtime keeps them: the outputs step's
teardown), then `release` unmounts the filesystem (umount(2)) and deletes the file (this
step's teardown, after it). The mount is the host's, not the agent's: it outlives an agent
restart, and a restarted agent releases it when the worker ends. Both are idempotent (a
crash midway is finished by the next call).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import hashlib
import logging
import os
import shutil
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..host import loopdev
from ..worker.layout import MOUNTS_DIR, OUTPUT_DIR, mount_dir
from .base import StepName, WorkerFailed

if TYPE_CHECKING:
    from ..worker.workdir import Worker

log = logging.getLogger("gpufleet.node_agent.disk")

GB = 10**9  # decimal, as podman's image sizes (images.py)
IMAGE = "disk.img"
TEMPLATES = "disk-templates"  # beside `workers/` in the agent's state directory
MOUNTPOINT = "disk"
MOUNT_OPTIONS = "loop,nosuid,nodev,noatime,noinit_itable,nobarrier"
MOUNT_DATA = "noinit_itable,nobarrier"  # the filesystem's own options of those (loopdev.mount)
MNT_DETACH = 2  # umount2(2): detach now, clean up when no longer busy
_libc = ctypes.CDLL(None, use_errno=True)
_loop_calls = True  # False once the kernel said it cannot (loopdev.Unsupported)


@dataclass(frozen=True)
class QuotaDir:
    name: str  # under the mount point
    target: str  # in the container
    mode: int
    kept: str | None  # where `release` keeps its content, under the worker directory


QUOTA_DIRS = (
    QuotaDir("output", "/opt/ml/output", 0o755, OUTPUT_DIR),
    QuotaDir("checkpoint", "/opt/ml/checkpoint", 0o755, f"{MOUNTS_DIR}/opt/ml/checkpoint"),
    QuotaDir("tmp", "/tmp", 0o1777, None),
    QuotaDir("var-tmp", "/var/tmp", 0o1777, None),
)


def size_bytes(disk_size_gb: int) -> int:
    """The backing file's size: `disk_size_gb` decimal GB (one at least)."""
    return max(1, int(disk_size_gb)) * GB


def tool(name: str) -> str:
    """`name` on PATH, or in the sbin directories a non-login root PATH may lack."""
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
    return found or name


def mkfs_argv(image: Path) -> list[str]:
    """ext4 without a journal (the data is scratch until the worker ends), reserved blocks
    (the job gets all of it) or the blocks kept for growing it while mounted (resize_inode:
    never grown, and 4.1 of the 4.3 MB every copy of a 10 GB template would write: issue
    15); inode tables initialised lazily: the file stays sparse (~0.2 MB of data)."""
    return [
        tool("mkfs.ext4"),
        "-q",
        "-F",
        "-O",
        "^has_journal,^resize_inode",
        "-m",
        "0",
        "-E",
        "lazy_itable_init=1,nodiscard",
        "-L",
        "gpufleet-worker",
        str(image),
    ]


def mount_argv(image: Path, mountpoint: Path) -> list[str]:
    # noinit_itable: the kernel does not zero the inode tables in the background (a sparse
    # file reads as zeros already), so a worker's disk costs the host only what it writes.
    # nobarrier: no cache flush from the worker's filesystem, which the loop device turns
    # into an fsync of the whole image on the host's disk (at the unmount, say). The image
    # is scratch, deleted when the worker ends; its kept output is copied out first, and a
    # crash of the machine ends the worker with it (issue 15).
    return [tool("mount"), "-t", "ext4", "-o", MOUNT_OPTIONS, str(image), str(mountpoint)]


def mount(image: Path, mountpoint: Path) -> str | None:
    """Loop-mount the worker's filesystem (loopdev.py; mount(8) where the kernel cannot)."""
    global _loop_calls
    if _loop_calls:
        try:
            loopdev.mount(image, mountpoint, "ext4", MOUNT_DATA)
            return None
        except loopdev.Unsupported as exc:
            log.info("worker disks mounted by mount(8): %s", exc)
            _loop_calls = False
        except OSError as exc:
            return str(exc)
    return _run(mount_argv(image, mountpoint))


def binds(worker_dir: Path) -> dict[str, Path]:
    """The container's writable places on the quota filesystem: {target: host path}."""
    return {q.target: worker_dir / MOUNTPOINT / q.name for q in QUOTA_DIRS}


def filled_at(worker_dir: Path, target: str) -> Path:
    """Where the inputs step fills the mount at `target`: under one of the quota
    filesystem's places when the container sees that place there (a checkpoint at
    /opt/ml/checkpoint/...: the job reads and updates it, within its quota), else its own
    directory under the worker's `mnt/`."""
    for bound, host in binds(worker_dir).items():
        if target == bound or target.startswith(bound + "/"):
            rest = [p for p in target[len(bound) :].split("/") if p and p not in (".", "..")]
            return host.joinpath(*rest)
    return mount_dir(worker_dir, target)


def _run(argv: list[str], timeout: float = 120) -> str | None:
    try:
        res = subprocess.run(argv, capture_output=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{argv[0]}: {exc}"
    if res.returncode != 0:
        err = (res.stderr or res.stdout).decode(errors="replace").strip()[-300:]
        return f"{os.path.basename(argv[0])} failed ({res.returncode}): {err}"
    return None


def template(templates: Path, disk_size_gb: int) -> Path | str:
    """The node's formatted, never-mounted filesystem of that size (made now if need be;
    named by the format's options too, so a change of them makes a new one), or why not."""
    options = hashlib.sha256("\0".join(mkfs_argv(Path())[1:-1]).encode()).hexdigest()[:12]
    path = templates / f"{disk_size_gb}gb-{options}.img"
    if path.exists():
        return path
    templates.mkdir(mode=0o700, parents=True, exist_ok=True)
    # made beside it and renamed: a worker never copies a half-made one
    part = templates / f".{path.name}.{os.getpid()}.{threading.get_ident()}"
    with part.open("wb") as f:
        f.truncate(size_bytes(disk_size_gb))  # sparse
    os.chmod(part, 0o600)
    error = _run(mkfs_argv(part))
    if error is not None:
        part.unlink(missing_ok=True)
        return error
    os.replace(part, path)
    return path


def copy_sparse(src: Path, dst: Path) -> None:
    """`dst` a copy of `src` with the same holes: only its data ranges are copied (in the
    kernel: copy_file_range), the rest stays a hole."""
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with src.open("rb") as s, os.fdopen(fd, "wb") as d:
        size = os.fstat(s.fileno()).st_size
        d.truncate(size)
        pos = 0
        while pos < size:
            try:
                start = os.lseek(s.fileno(), pos, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno == errno.ENXIO:  # no data past pos
                    break
                raise
            end = os.lseek(s.fileno(), start, os.SEEK_HOLE)
            while start < end:
                n = os.copy_file_range(
                    s.fileno(), d.fileno(), end - start, offset_src=start, offset_dst=start
                )
                if n == 0:
                    raise OSError(errno.EIO, f"copy of {src} stopped at {start}")
                start += n
            pos = end


def setup(worker_dir: Path, disk_size_gb: int, uid: int) -> str | None:
    """A fresh quota filesystem for a worker whose container has not run yet, mounted at
    `disk/` with its directories owned by `uid`. None, or why not (the worker then fails)."""
    _unmount(worker_dir / MOUNTPOINT)  # what a launch cut short left
    image = worker_dir / IMAGE
    image.unlink(missing_ok=True)
    free = shutil.disk_usage(worker_dir).free
    if free < size_bytes(disk_size_gb):  # sparse files overcommit; not beyond this at least
        return f"the node's disk has {free / GB:.1f} GB free, less than disk_size_gb {disk_size_gb}"
    mountpoint = worker_dir / MOUNTPOINT
    mountpoint.mkdir(mode=0o755, exist_ok=True)
    made = template(worker_dir.parent.parent / TEMPLATES, disk_size_gb)
    if isinstance(made, str):
        error: str | None = made
    else:
        try:
            copy_sparse(made, image)
            os.chmod(image, 0o600)
        except OSError as exc:
            error = f"copying {made.name}: {exc}"
        else:
            error = mount(image, mountpoint)
    if error is not None:
        image.unlink(missing_ok=True)
        return f"cannot set up the worker's disk of {disk_size_gb} GB: {error}"
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(mountpoint / "lost+found")
    for q in QUOTA_DIRS:
        d = mountpoint / q.name
        d.mkdir(exist_ok=True)
        os.chown(d, uid, uid)
        os.chmod(d, q.mode)
    return None


def _umount2(mountpoint: Path, flags: int = 0) -> str | None:
    """umount(2) itself: no `umount` process per worker (issue 15). The loop device goes
    with the mount: it was set up with autoclear (loopdev.py, or mount(8))."""
    if _libc.umount2(os.fsencode(mountpoint), flags) == 0:
        return None
    return os.strerror(ctypes.get_errno())


def _unmount(mountpoint: Path) -> bool:
    """Unmount (lazily when busy); True if it was mounted."""
    if not os.path.ismount(mountpoint):
        return False
    error = _umount2(mountpoint)
    if error is not None:
        log.warning("%s: %s; detaching it lazily", mountpoint, error)
        error = _umount2(mountpoint, MNT_DETACH)
        if error is not None:
            log.warning("%s: lazy unmount: %s", mountpoint, error)
    return True


def _is_empty(path: Path) -> bool:
    with os.scandir(path) as it:
        return next(it, None) is None


def in_use(worker_dir: Path) -> bool:
    """Has the worker a quota filesystem (mounted, or its file left)?"""
    return (worker_dir / IMAGE).exists() or os.path.ismount(worker_dir / MOUNTPOINT)


def mounted(worker_dir: Path) -> bool:
    return os.path.ismount(worker_dir / MOUNTPOINT)


def to_keep(worker_dir: Path) -> list[QuotaDir]:
    """The directories of a mounted quota filesystem that hold something to keep."""
    mountpoint = worker_dir / MOUNTPOINT
    if not os.path.ismount(mountpoint):
        return []
    return [
        q
        for q in QUOTA_DIRS
        if q.kept is not None
        and (mountpoint / q.name).is_dir()
        and not _is_empty(mountpoint / q.name)  # nothing to keep: no `cp` process (issue 15)
    ]


def keep(worker_dir: Path, dirs: list[QuotaDir]) -> None:
    """The worker has ended: copy what it left in `dirs` of its quota filesystem (`to_keep`)
    into its directory, where the process runtime keeps them. Again after a crash midway:
    `cp` overwrites what it copied before."""
    mountpoint = worker_dir / MOUNTPOINT
    for q in dirs:
        assert q.kept is not None
        dst = worker_dir / q.kept
        dst.mkdir(parents=True, exist_ok=True)
        # -a: symlinks stay links (never followed), owners and modes kept
        error = _run([tool("cp"), "-a", "--", f"{mountpoint / q.name}/.", f"{dst}/"], timeout=3600)
        if error is not None:
            log.warning("worker %s: keeping its %s: %s", worker_dir.name, q.name, error)


def release(worker_dir: Path) -> None:
    """The worker has ended and its container is gone (and what it left is kept: `keep`):
    unmount its filesystem, delete the file. Quick when there is none."""
    if not in_use(worker_dir):
        return
    mountpoint = worker_dir / MOUNTPOINT
    if os.path.ismount(mountpoint):
        _unmount(mountpoint)
    (worker_dir / IMAGE).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        mountpoint.rmdir()


class DiskStep:
    """A container worker's quota filesystem of its `disk_size_gb` (`setup`), unmounted and
    deleted once it has ended (`release`; what it left there is kept first, by the outputs
    step, whose teardown runs before this one's). Off (`quota` False): no filesystem, but a
    worker an earlier agent gave one still has it released."""

    name = StepName.disk
    marked = True

    def __init__(self, uid: int, quota: bool) -> None:
        self.uid = uid  # who owns its directories: the worker's user
        self.quota = quota

    async def setup(self, w: Worker) -> None:
        if not self.quota:
            return
        error = await asyncio.to_thread(setup, w.dir, w.spec.disk_size_gb, self.uid)
        if error is not None:
            raise WorkerFailed(error)

    async def teardown(self, w: Worker) -> None:
        if in_use(w.dir):
            await asyncio.to_thread(release, w.dir)
