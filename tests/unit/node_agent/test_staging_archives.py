"""Archives unpacked into a mount's directory (staging/archives.py): each unsafe entry
refused by name, the byte budget (a zip bomb too), set-uid and set-gid dropped."""

from __future__ import annotations

import io
import stat
import tarfile
import zipfile
from pathlib import Path

import pytest
from gpufleet_node_agent.staging.archives import extract, place
from gpufleet_node_agent.steps.base import WorkerFailed


def _tar(path: Path, *members: tuple[tarfile.TarInfo, bytes | None], mode: str = "w") -> Path:
    with tarfile.open(path, mode) as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _info(
    name: str, kind: bytes = tarfile.REGTYPE, link: str = "", mode: int = 0o644
) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, mode
    return info


@pytest.mark.parametrize("compression", ["w", "w:gz", "w:bz2"])
def test_a_tar_is_unpacked_and_set_uid_bits_are_dropped(tmp_path: Path, compression: str) -> None:
    archive = _tar(
        tmp_path / "a.tar",
        (_info("bin/run", mode=0o6755), b"#!/bin/sh\n"),
        (_info("data/a.csv"), b"x,y\n"),
        (_info("data/link", tarfile.SYMTYPE, "a.csv"), None),
        mode=compression,
    )
    dest = tmp_path / "out"
    dest.mkdir()
    extract(archive, dest, "s3://b/a.tar", 1024)
    assert (dest / "data/a.csv").read_bytes() == b"x,y\n"
    assert (dest / "data/link").read_bytes() == b"x,y\n"
    mode = (dest / "bin/run").stat().st_mode
    assert not mode & (stat.S_ISUID | stat.S_ISGID)
    assert mode & stat.S_IXUSR


@pytest.mark.parametrize(
    ("member", "why"),
    [
        (_info("../x"), "entry '../x' escapes the directory"),
        (_info("a/../../x"), "entry 'a/../../x' escapes the directory"),
        (_info("/etc/x"), "entry '/etc/x' escapes the directory"),
        (_info("l", tarfile.SYMTYPE, "../../etc/passwd"), "entry 'l' links outside"),
        (_info("l", tarfile.SYMTYPE, "/etc/passwd"), "entry 'l' links outside"),
        (_info("h", tarfile.LNKTYPE, "../etc/passwd"), "entry 'h' links outside"),
        (_info("dev", tarfile.CHRTYPE), "entry 'dev' is a device file or fifo"),
        (_info("blk", tarfile.BLKTYPE), "entry 'blk' is a device file or fifo"),
        (_info("pipe", tarfile.FIFOTYPE), "entry 'pipe' is a device file or fifo"),
    ],
)
def test_an_unsafe_tar_entry_is_refused_by_name(
    tmp_path: Path, member: tarfile.TarInfo, why: str
) -> None:
    data = b"x" if member.type == tarfile.REGTYPE else None
    archive = _tar(tmp_path / "a.tar", (member, data))
    dest = tmp_path / "out"
    dest.mkdir()
    with pytest.raises(WorkerFailed, match=f"unsafe archive s3://b/a.tar: {why}"):
        extract(archive, dest, "s3://b/a.tar", 1024)
    assert not (tmp_path / "x").exists()
    assert list(dest.iterdir()) == []


def test_a_tar_past_the_budget_is_too_large_before_anything_is_written(tmp_path: Path) -> None:
    archive = _tar(tmp_path / "a.tar", (_info("a"), b"a" * 600), (_info("b"), b"b" * 600))
    dest = tmp_path / "out"
    dest.mkdir()
    with pytest.raises(WorkerFailed, match=r"a\.tar is too large"):
        extract(archive, dest, "a.tar", 1000)
    assert list(dest.iterdir()) == []


def _zip(path: Path, entries: dict[str, bytes], attrs: dict[str, int] | None = None) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (attrs or {}).get(name, 0o100644) << 16
            zf.writestr(info, data, zipfile.ZIP_DEFLATED)
    return path


def test_a_zip_is_unpacked(tmp_path: Path) -> None:
    archive = _zip(tmp_path / "a.zip", {"data/a.csv": b"x,y\n", "run": b"#!"}, {"run": 0o106755})
    dest = tmp_path / "out"
    dest.mkdir()
    extract(archive, dest, "a.zip", 1024)
    assert (dest / "data/a.csv").read_bytes() == b"x,y\n"
    assert not (dest / "run").stat().st_mode & (stat.S_ISUID | stat.S_ISGID)


@pytest.mark.parametrize(
    ("name", "attr", "why"),
    [
        ("../x", 0o100644, "entry '../x' escapes the directory"),
        ("/abs/x", 0o100644, "entry '/abs/x' escapes the directory"),
        ("..\\x", 0o100644, "entry .* escapes the directory"),
        ("link", 0o120777, "entry 'link' is a symbolic link"),
        ("fifo", 0o010644, "entry 'fifo' is a device file or fifo"),
    ],
)
def test_an_unsafe_zip_entry_is_refused_by_name(
    tmp_path: Path, name: str, attr: int, why: str
) -> None:
    archive = _zip(tmp_path / "a.zip", {name: b"../../etc/passwd"}, {name: attr})
    dest = tmp_path / "out"
    dest.mkdir()
    with pytest.raises(WorkerFailed, match=f"unsafe archive a.zip: {why}"):
        extract(archive, dest, "a.zip", 1024)
    assert list(dest.iterdir()) == [] and not (tmp_path / "x").exists()


def test_a_zip_bomb_is_too_large_even_when_it_lies_about_its_size(tmp_path: Path) -> None:
    archive = _zip(tmp_path / "bomb.zip", {"big": b"\0" * (4 * 1024 * 1024)})
    dest = tmp_path / "out"
    dest.mkdir()
    with pytest.raises(WorkerFailed, match=r"bomb\.zip is too large"):
        extract(archive, dest, "bomb.zip", 1024 * 1024)  # said before writing
    # the same, its sizes rewritten to say 1 byte: caught while writing
    raw = bytearray(archive.read_bytes())
    with zipfile.ZipFile(archive) as zf:
        info = zf.infolist()[0]
    size = (4 * 1024 * 1024).to_bytes(4, "little")
    raw[:] = raw.replace(size, (1).to_bytes(4, "little"))
    (tmp_path / "liar.zip").write_bytes(bytes(raw))
    assert info.file_size == 4 * 1024 * 1024
    with pytest.raises(WorkerFailed, match=r"liar\.zip (is too large|is not a readable archive)"):
        extract(tmp_path / "liar.zip", dest, "liar.zip", 1024 * 1024)
    assert sum(p.stat().st_size for p in dest.rglob("*") if p.is_file()) <= 1024 * 1024


def test_place_unpacks_an_archive_and_keeps_another_file_under_its_name(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    dest.mkdir()
    part = dest / ".part"
    part.write_bytes(b"weights")
    place(part, "models/w.bin", dest, "s3://b/models/w.bin", 1024)
    assert [p.name for p in dest.iterdir()] == ["w.bin"]
    _zip(part, {"a.txt": b"a"})
    place(part, "d.zip", dest, "d.zip", 1024)
    assert sorted(p.name for p in dest.iterdir()) == ["a.txt", "w.bin"]
