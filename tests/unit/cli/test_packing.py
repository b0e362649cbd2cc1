"""What `job connect` sends for a `local` mount: a file as it is, a directory as one tar of
its contents, a link leaving the directory refused, the spec's `~` and `$VAR` expanded."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import pytest
from gpufleet_cli.packing import PackRefused, expanded, file_name, packed


def _tree(root: Path) -> Path:
    data = root / "data"
    (data / "sub").mkdir(parents=True)
    (data / "a.txt").write_text("alpha\n")
    (data / "sub" / "b.txt").write_text("beta\n")
    return data


def test_a_directory_is_one_tar_of_its_contents(tmp_path: Path) -> None:
    data = _tree(tmp_path)
    os.symlink("sub/b.txt", data / "link-in")
    work = tmp_path / "work"
    work.mkdir()
    sent = packed(str(data), work)
    assert sent.name == "data.tar" and sent.path.parent == work
    assert sent.size == sent.path.stat().st_size
    with tarfile.open(sent.path) as tar:
        names = {m.name: m for m in tar.getmembers()}
        assert set(names) == {"a.txt", "sub", "sub/b.txt", "link-in"}
        assert names["link-in"].issym() and names["link-in"].linkname == "sub/b.txt"
        member = tar.extractfile("sub/b.txt")
        assert member is not None and member.read() == b"beta\n"


def test_a_file_is_sent_as_it_is(tmp_path: Path) -> None:
    f = tmp_path / "weights@v1.bin"
    f.write_bytes(b"\x00\x01")
    sent = packed(str(f), tmp_path)
    assert (sent.path, sent.name, sent.size) == (f, "weights_v1.bin", 2)


@pytest.mark.parametrize("target", ["../../etc/passwd", "/etc/passwd", "../../outside.txt"])
def test_a_link_leaving_the_directory_is_refused(tmp_path: Path, target: str) -> None:
    data = _tree(tmp_path)
    (tmp_path / "outside.txt").write_text("secret\n")
    os.symlink(target, data / "sub" / "escape")
    with pytest.raises(PackRefused, match="a link leaving the directory"):
        packed(str(data), tmp_path)
    assert not (tmp_path / "data.tar").exists()


def test_the_specs_path_is_expanded_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("GPUFLEET_TEST_DATA", str(tmp_path / "d"))
    monkeypatch.delenv("GPUFLEET_UNSET_VAR", raising=False)
    assert expanded("~/data") == tmp_path / "data"
    assert expanded("$GPUFLEET_TEST_DATA/x") == tmp_path / "d" / "x"
    with pytest.raises(PackRefused, match="not set"):
        expanded("$GPUFLEET_UNSET_VAR/x")
    with pytest.raises(PackRefused, match="no such file or directory"):
        packed("~/missing", tmp_path)


def test_a_file_name_is_one_the_datastore_takes() -> None:
    assert file_name("My Data (v2).csv") == "My Data _v2_.csv"
    assert file_name(".hidden") == "hidden"
    assert file_name("___") == "data___"
