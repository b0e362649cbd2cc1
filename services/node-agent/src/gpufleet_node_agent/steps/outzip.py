"""A worker's output directory as one zip archive (R-JOB-3: `<job_name>.zip`, or
`<job_name>_<worker>.zip` for a job of several workers), with a `MANIFEST.sha256` inside:
one `<sha256>  <path>` line per file (`sha256sum -c` reads it), within the worker's disk
budget. Symlinks are not followed and not stored (a job's link could name any file of the
node); nor is anything but regular files and directories. Plain files in, one file out."""

from __future__ import annotations

import hashlib
import os
import zipfile
from pathlib import Path

from .base import WorkerFailed

MANIFEST = "MANIFEST.sha256"
CHUNK = 1024 * 1024


def too_large(limit: int) -> WorkerFailed:
    return WorkerFailed(f"the output is too large: its archive passed the {limit} bytes allowed")


def files_of(root: Path) -> list[tuple[Path, str]]:
    """The regular files under `root` with their paths in the archive, sorted; symlinks (to
    files or to directories) left out. `MANIFEST.sha256` at the top is the archive's own."""
    found: list[tuple[Path, str]] = []
    for here, dirs, names in os.walk(root, followlinks=False):
        base = Path(here)
        dirs[:] = sorted(d for d in dirs if not (base / d).is_symlink())
        for name in names:
            path = base / name
            if path.is_symlink() or not path.is_file():
                continue
            rel = path.relative_to(root).as_posix()
            if rel != MANIFEST:
                found.append((path, rel))
    return sorted(found, key=lambda f: f[1])


def archive(root: Path, dest: Path, limit_bytes: int) -> int:
    """Zip the files under `root` into `dest` (made again if it exists) with their manifest;
    its size, or WorkerFailed past `limit_bytes` (the archive is removed then)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    try:
        with (
            dest.open("wb") as out,
            zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, allowZip64=True) as zf,
        ):
            for path, rel in files_of(root) if root.is_dir() else []:
                digest = hashlib.sha256()
                with path.open("rb") as src, zf.open(rel, "w", force_zip64=True) as dst:
                    while chunk := src.read(CHUNK):
                        digest.update(chunk)
                        dst.write(chunk)
                        if out.tell() > limit_bytes:
                            raise too_large(limit_bytes)
                lines.append(f"{digest.hexdigest()}  {rel}\n")
            zf.writestr(MANIFEST, "".join(lines))
        size = dest.stat().st_size
        if size > limit_bytes:
            raise too_large(limit_bytes)
        return size
    except BaseException:
        dest.unlink(missing_ok=True)
        raise


def verify(path: Path) -> list[str]:
    """What is wrong with an archive made by `archive` (empty: nothing): each file's
    checksum against its manifest line, and no file left out of the manifest."""
    problems: list[str] = []
    with zipfile.ZipFile(path) as zf:
        listed: dict[str, str] = {}
        for line in zf.read(MANIFEST).decode().splitlines():
            digest, _, rel = line.partition("  ")
            listed[rel] = digest
        for info in zf.infolist():
            if info.filename == MANIFEST or info.is_dir():
                continue
            digest = hashlib.sha256(zf.read(info)).hexdigest()
            if listed.pop(info.filename, None) != digest:
                problems.append(f"{info.filename}: not as its manifest says")
        problems += [f"{rel}: in the manifest, not in the archive" for rel in listed]
    return problems
