"""The region's datastores (R-RES-2) as this node has them: each one's root directory on the
node (an NFS or SMB share the operator mounted there, GPUFLEET_REGIONAL_DATASTORES, or one
the node mounted for its workers: mounts/keeper.py, whose `roots` this reads live), and a
`DatastoreRef` source copied from `<root>/<path>` into a worker's mount directory, within
its disk, and a worker's output zip put into `<root>/<path>/` (services/node-agent/README.md,
"Regional datastores").

Nothing outside the root is read: the path is checked as the contract checks it (no `..`,
no NUL, no encoded dots), then resolved on the node (`realpath`) and must still be inside
the root's own real path; the copy then opens every directory and file from the root down,
one name at a time and never following a symlink (`O_NOFOLLOW` relative to its parent's
descriptor), so a link swapped in after the check fails the copy instead of leaving the
root. A symlink inside the tree is copied as the file it names when that file is inside the
root too; one that points outside the root, at a directory or nowhere fails the worker, as
does a device file, fifo or socket. An output's directory is walked (and made) the same way:
a symlink on its path fails the upload.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import os
import stat
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from gpufleet_contracts.fields import name_problem
from gpufleet_contracts.locations import DatastoreRef, OutputTarget, Source
from gpufleet_contracts.paths import UnsafePath, rooted_join

from ..steps.base import WorkerFailed
from .meter import Meter
from .registry import Transfer

CHUNK = 1024 * 1024
_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def parse_roots(text: str) -> dict[str, Path]:
    """`name=/abs/root,name2=/root2` (GPUFLEET_REGIONAL_DATASTORES) as {name: root}; a bad
    entry raises ValueError, so the agent refuses to start rather than a job failing."""
    roots: dict[str, Path] = {}
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        name, sep, root = (p.strip() for p in entry.partition("="))
        if not sep or not name or not root:
            raise ValueError(f"{entry!r} is not name=/root/directory")
        problem = name_problem(name)
        if problem is not None:
            raise ValueError(f"datastore name {name!r}: {problem}")
        if not root.startswith("/"):
            raise ValueError(f"datastore {name}: root {root!r} is not an absolute path")
        if name in roots:
            raise ValueError(f"datastore {name} is named twice")
        roots[name] = Path(os.path.normpath(root))
    return roots


@dataclass(frozen=True)
class Resolved:
    """A datastore path on this node: the root's real path and, under it, the path's
    (relative, without symlinks when it was resolved; `.` for the root itself)."""

    datastore: str
    root: str
    rel: str
    shown: str  # as a reason names it: `datastore nas:/sub/dir`


class Datastores:
    """This node's datastores (`roots`, by name, read at each use: a mapping the keeper
    changes as it mounts and heals) in its `region`."""

    def __init__(self, roots: Mapping[str, Path], region: str) -> None:
        self.roots = roots
        self.region = region

    def _root(self, ref: DatastoreRef) -> tuple[str, str]:
        """(the root's real path, `ref`'s path joined to it: rooted_join, the one join of a
        datastore's root and a path in it)."""
        shown = f"datastore {ref.datastore}:{ref.path}"
        if ref.region is not None and ref.region != self.region:
            raise WorkerFailed(
                f"datastore {ref.datastore} is in region {ref.region}; "
                f"this node is in region {self.region}"
            )
        root = self.roots.get(ref.datastore)
        if root is None:
            raise WorkerFailed(f"datastore {ref.datastore} is not mounted on this node")
        real_root = os.path.realpath(root)
        try:
            joined = rooted_join(real_root, ref.path)
        except UnsafePath as exc:
            raise WorkerFailed(f"{shown} could resolve outside its root: {exc}") from None
        if not os.path.isdir(real_root):
            raise WorkerFailed(
                f"datastore {ref.datastore} is not mounted on this node ({root} is not a directory)"
            )
        return real_root, joined

    def resolve(self, ref: DatastoreRef) -> Resolved:
        """Where `ref` is on this node, or WorkerFailed saying why it is not."""
        shown = f"datastore {ref.datastore}:{ref.path}"
        real_root, joined = self._root(ref)
        real = os.path.realpath(joined)
        if os.path.commonpath([real_root, real]) != real_root:
            raise WorkerFailed(f"{shown} resolves outside the datastore's root (a symlink)")
        if not os.path.lexists(real):
            raise WorkerFailed(f"{shown} not found")
        return Resolved(ref.datastore, real_root, os.path.relpath(real, real_root), shown)

    async def fetch(self, source: Source, dest: Path, t: Transfer) -> None:
        if not isinstance(source, DatastoreRef):
            raise WorkerFailed(f"not a datastore source: {source.kind}")
        found = self.resolve(source)
        meter = Meter(found.shown, t)
        await asyncio.to_thread(copy_beneath, found, dest, meter)
        meter.finish()

    async def put(self, path: Path, target: OutputTarget, t: Transfer) -> None:
        """The output zip `path` into the datastore's directory `target.path` (made if
        missing), under its own name, then read back."""
        if not isinstance(target, DatastoreRef):
            raise WorkerFailed(f"not a datastore target: {target.kind}")
        root, joined = self._root(target)
        rel = joined[len(root) :].strip("/") or "."  # rooted_join: the root, then segments
        inside = "" if rel == "." else f"/{rel}"
        shown = f"datastore {target.datastore}:{inside}/{path.name}"
        meter = Meter(shown, t, bounded=False)  # its size: when it is opened
        await asyncio.to_thread(put_beneath, root, rel, path, shown, meter)
        meter.finish()


def _failed(found: Resolved, rel: str, why: str) -> WorkerFailed:
    where = found.shown if rel in ("", ".") else f"{found.shown} ({rel})"
    return WorkerFailed(f"cannot copy {where}: {why}")


@contextmanager
def _opened(found: Resolved, rel: str) -> Iterator[int]:
    """`rel` under the root, opened one name at a time from the root's own descriptor, none
    of them followed if it is a symlink (ELOOP: a link swapped in since it was resolved)."""
    fd = os.open(found.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in (n for n in rel.split("/") if n not in ("", ".")):
            try:
                child = os.open(name, _OPEN, dir_fd=fd)
            except OSError as exc:
                why = "a symlink, not followed" if exc.errno == errno.ELOOP else exc.strerror
                raise _failed(found, rel, f"{name}: {why}") from None
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def copy_beneath(found: Resolved, dest: Path, meter: Meter) -> None:
    """`found` (a directory: its tree; a file: that file) into the directory `dest`."""
    try:
        with _opened(found, found.rel) as fd:
            mode = os.fstat(fd).st_mode
            if stat.S_ISDIR(mode):
                _copy_dir(found, fd, found.rel, dest, meter)
            elif stat.S_ISREG(mode):
                _copy_file(fd, dest / os.path.basename(found.rel), meter)
            else:
                raise _failed(found, found.rel, "not a file or directory")
    except OSError as exc:
        raise _failed(found, found.rel, str(exc)) from None


def _copy_file(fd: int, dest: Path, meter: Meter) -> None:
    out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        while chunk := os.read(fd, CHUNK):
            meter.add(len(chunk))
            os.write(out, chunk)
    finally:
        os.close(out)


def _copy_dir(found: Resolved, fd: int, rel: str, dest: Path, meter: Meter) -> None:
    with os.scandir(fd) as entries:
        names = sorted(e.name for e in entries)
    for name in names:
        sub = name if rel in ("", ".") else f"{rel}/{name}"
        try:
            child = os.open(name, _OPEN, dir_fd=fd)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            _copy_link(found, sub, dest / name, meter)
            continue
        try:
            mode = os.fstat(child).st_mode
            if stat.S_ISDIR(mode):
                (dest / name).mkdir(mode=0o755)
                _copy_dir(found, child, sub, dest / name, meter)
            elif stat.S_ISREG(mode):
                _copy_file(child, dest / name, meter)
            else:
                raise _failed(found, sub, "a device file, fifo or socket")
        finally:
            os.close(child)


def _copy_link(found: Resolved, rel: str, dest: Path, meter: Meter) -> None:
    """A symlink in the tree: the file it names, when that file is inside the root."""
    real = os.path.realpath(os.path.join(found.root, rel))
    if os.path.commonpath([found.root, real]) != found.root:
        raise _failed(found, rel, "a symlink that points outside the datastore's root")
    if not os.path.lexists(real):
        raise _failed(found, rel, "a symlink that points nowhere")
    with _opened(found, os.path.relpath(real, found.root)) as fd:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _failed(found, rel, "a symlink to a directory or special file (not followed)")
        _copy_file(fd, dest, meter)


def _directory(root: str, rel: str, shown: str) -> int:
    """The directory `rel` under `root`, opened (and made where missing, 0755) one name at
    a time from the root's descriptor, never through a symlink."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in (n for n in rel.split("/") if n not in ("", ".")):
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o755, dir_fd=fd)
            try:
                child = os.open(name, os.O_DIRECTORY | _OPEN, dir_fd=fd)
            except OSError as exc:  # a symlink: ELOOP, or ENOTDIR with O_DIRECTORY
                link = stat.S_ISLNK(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
                why = "a symlink, not followed" if link else exc.strerror
                raise WorkerFailed(f"cannot put {shown}: {name}: {why}") from None
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def put_beneath(root: str, rel: str, path: Path, shown: str, meter: Meter) -> None:
    """`path` into the directory `rel` under `root` as `.<name>.part`, renamed to its name
    once whole (a reader never sees half a zip), then read back: its size and SHA-256 must
    be what was sent, else `upload not verified`."""
    name = path.name
    part = f".{name}.part"
    try:
        fd = _directory(root, rel, shown)
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(part, dir_fd=fd)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            out = os.open(part, flags, 0o644, dir_fd=fd)
            sent = hashlib.sha256()
            try:
                with path.open("rb") as f:
                    meter.total = os.fstat(f.fileno()).st_size
                    while chunk := f.read(CHUNK):
                        os.write(out, chunk)
                        sent.update(chunk)
                        meter.add(len(chunk))
                os.fsync(out)
            finally:
                os.close(out)
            os.replace(part, name, src_dir_fd=fd, dst_dir_fd=fd)
            back = hashlib.sha256()
            read = os.open(name, _OPEN, dir_fd=fd)
            try:
                while chunk := os.read(read, CHUNK):
                    back.update(chunk)
            finally:
                os.close(read)
        finally:
            os.close(fd)
    except OSError as exc:
        raise WorkerFailed(f"cannot put {shown}: {exc.strerror or exc}") from None
    if back.digest() != sent.digest():
        raise WorkerFailed(f"{shown}: upload not verified")
