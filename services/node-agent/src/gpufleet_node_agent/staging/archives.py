"""Archives fetched as one object, unpacked safely into a mount's directory: zip, tar,
tar.gz (tgz), tar.bz2. An entry that would land outside the directory (`../`, an absolute
name, a link pointing out), a device file or fifo is refused by name; set-uid and set-gid
bits are dropped (tarfile's `data` filter); the sum of the entries' sizes past the bytes
left fails "too large", checked before writing and while writing (a zip bomb)."""

from __future__ import annotations

import os
import posixpath
import shutil
import tarfile
import zipfile
from pathlib import Path

from ..steps.base import WorkerFailed

SUFFIXES = (".zip", ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2")
CHUNK = 1024 * 1024


def is_archive(name: str) -> bool:
    return name.lower().endswith(SUFFIXES)


def _unsafe(archive: str, entry: str, why: str) -> WorkerFailed:
    return WorkerFailed(f"unsafe archive {archive}: entry {entry[:200]!r} {why}")


def _too_large(archive: str, limit: int) -> WorkerFailed:
    return WorkerFailed(f"{archive} is too large: unpacked, more than the {limit} bytes left")


def _inside(name: str) -> str | None:
    """`name` normalized relative to the directory, or None when it leaves it."""
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        return None
    norm = posixpath.normpath(name.replace("\\", "/"))
    if norm == ".." or norm.startswith("../"):
        return None
    return norm


def _check_tar(tar: tarfile.TarFile, archive: str, limit: int) -> None:
    total = 0
    for m in tar.getmembers():
        if _inside(m.name) is None:
            raise _unsafe(archive, m.name, "escapes the directory")
        if m.ischr() or m.isblk() or m.isfifo():
            raise _unsafe(archive, m.name, "is a device file or fifo")
        if m.issym():
            base = posixpath.dirname(m.name)
            if _inside(m.linkname) is None or _inside(posixpath.join(base, m.linkname)) is None:
                raise _unsafe(archive, m.name, "links outside the directory")
        if m.islnk() and _inside(m.linkname) is None:
            raise _unsafe(archive, m.name, "links outside the directory")
        if m.isfile():
            total += m.size
            if total > limit:
                raise _too_large(archive, limit)


def _extract_tar(path: Path, dest: Path, archive: str, limit: int) -> None:
    try:
        with tarfile.open(path, "r:*") as tar:
            _check_tar(tar, archive, limit)
            tar.extractall(dest, filter="data")  # set-uid, set-gid dropped; links checked
    except tarfile.FilterError as exc:
        name = getattr(getattr(exc, "tarinfo", None), "name", "?")
        raise _unsafe(archive, name, str(exc).split(":")[0].lower()) from None
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise WorkerFailed(f"{archive} is not a readable archive: {type(exc).__name__}") from None


def _extract_zip(path: Path, dest: Path, archive: str, limit: int) -> None:
    try:
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
            names: list[tuple[zipfile.ZipInfo, str]] = []
            declared = 0
            for info in infos:
                norm = _inside(info.filename)
                if norm is None:
                    raise _unsafe(archive, info.filename, "escapes the directory")
                kind = (info.external_attr >> 16) & 0o170000
                if kind == 0o120000:
                    raise _unsafe(archive, info.filename, "is a symbolic link")
                if kind in (0o020000, 0o060000, 0o010000, 0o140000):
                    raise _unsafe(archive, info.filename, "is a device file or fifo")
                declared += info.file_size
                if declared > limit:
                    raise _too_large(archive, limit)
                names.append((info, norm))
            written = 0
            for info, norm in names:
                target = dest / norm
                if info.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                if any(p.is_symlink() for p in [target, *target.parents] if p != dest):
                    raise _unsafe(archive, info.filename, "escapes the directory")
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
                with zf.open(info) as src, os.fdopen(fd, "wb") as out:
                    while chunk := src.read(CHUNK):
                        written += len(chunk)
                        if written > limit:  # more than it said: a bomb
                            raise _too_large(archive, limit)
                        out.write(chunk)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, NotImplementedError) as exc:
        raise WorkerFailed(f"{archive} is not a readable archive: {type(exc).__name__}") from None


def extract(path: Path, dest: Path, archive: str, limit: int) -> None:
    """The archive at `path` (named `archive` in reasons) unpacked into `dest`."""
    if archive.lower().endswith(".zip"):
        _extract_zip(path, dest, archive, limit)
    else:
        _extract_tar(path, dest, archive, limit)


def place(part: Path, name: str, dest: Path, shown: str, limit: int) -> None:
    """One fetched object (`part`, already in `dest`) where it goes: an archive unpacked
    into `dest` (with what is left beside the archive itself), any other file as `name`."""
    try:
        if is_archive(name):
            extract(part, dest, shown, limit - part.stat().st_size)
        else:
            target = dest / posixpath.basename(name.rstrip("/"))
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            os.replace(part, target)
    finally:
        part.unlink(missing_ok=True)
