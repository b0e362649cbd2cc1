"""What `gpufleet job connect` sends for a job's `local` mount: the path the spec names
(`~/data`, `/abs`, `$VAR/x`), expanded on this machine; a file as it is, a directory as one
tar of what it holds (unpacked into the mount on the node). A link that leaves the directory
is refused, and so is anything but files, directories and links inside it."""

from __future__ import annotations

import os
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path

# a relayed file's name: letters, digits, spaces and `._-`, as the datastore takes it
_UNNAMED = re.compile(r"[^A-Za-z0-9 ._-]")
NAME_CHARS = 200


class PackRefused(Exception):
    """This path cannot be sent: why."""


@dataclass(frozen=True)
class Packed:
    """The file to put (`path`), under the name the node reads it by (`name`)."""

    path: Path
    name: str
    size: int


def expanded(spec_path: str) -> Path:
    """A `local` path as the spec wrote it, on this machine: `~` and `$VAR` expanded."""
    path = os.path.expandvars(os.path.expanduser(spec_path))
    if "$" in path:
        raise PackRefused(f"{spec_path}: a variable in it is not set here")
    return Path(path)


def file_name(name: str) -> str:
    """`name` as a relayed file may be named (other characters made `_`)."""
    safe = _UNNAMED.sub("_", name).strip(" .")[:NAME_CHARS].rstrip(" .")
    if not safe or not safe[0].isalnum():
        safe = f"data{safe}"[:NAME_CHARS]
    return safe


def _inside(root: Path, entry: Path) -> None:
    """A link under `root` must point inside it, by a relative target."""
    target = os.readlink(entry)
    resolved = (entry.parent / target).resolve()
    if os.path.isabs(target) or not resolved.is_relative_to(root):
        raise PackRefused(f"{entry}: a link leaving the directory ({target})")


def tarred(root: Path, into: Path) -> Path:
    """The directory `root`'s contents as one tar at `into` (names relative to `root`)."""
    root = root.resolve()
    entries: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        for name in sorted(dirnames) + sorted(filenames):
            entry = here / name
            if entry.is_symlink():
                _inside(root, entry)
            elif not (entry.is_dir() or entry.is_file()):
                raise PackRefused(f"{entry}: not a file, a directory or a link")
            entries.append(entry)
        dirnames[:] = sorted(d for d in dirnames if not (here / d).is_symlink())
    with tarfile.open(into, "w") as tar:
        for entry in entries:
            tar.add(entry, arcname=str(entry.relative_to(root)), recursive=False)
    return into


def packed(spec_path: str, workdir: Path) -> Packed:
    """What to put for the `local` path `spec_path`: a file as it is, a directory tarred into
    `workdir` as `<its name>.tar`."""
    path = expanded(spec_path)
    if path.is_symlink() and path.is_dir():
        path = path.resolve()
    if path.is_file():
        return Packed(path, file_name(path.name), path.stat().st_size)
    if not path.is_dir():
        raise PackRefused(f"{spec_path}: no such file or directory here ({path})")
    name = file_name(f"{path.name or 'data'}.tar")
    tar = tarred(path, workdir / name)
    return Packed(tar, name, tar.stat().st_size)
