"""The kernel adapter's mount command, over plain data: `nosuid,nodev` always, NFS `soft`
unless told, the datastore's own options, and an SMB password only ever in a 0600
credentials file that is gone once the mount command ended, never in the arguments."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from gpufleet_contracts.datastores import DatastoreMount
from gpufleet_node_agent.mounts.kernel import KernelMounter, argv, credentials_file
from gpufleet_node_agent.mounts.port import Unreachable, is_mounted

NFS = DatastoreMount(
    name="nas", region_id="a/lab", type="nfs", address="10.0.0.5", root_path="/export/dir2"
)
SMB = DatastoreMount(
    name="win",
    region_id="a/lab",
    type="smb",
    address="fd00::5",
    root_path="/share/dir",
    mount_options=["vers=3.0"],
    username="alice",
)


def test_the_mount_commands() -> None:
    at = Path("/m")
    assert argv(NFS, at, None) == [
        "mount",
        "-t",
        "nfs",
        "-o",
        "nosuid,nodev,soft",
        "--",
        "10.0.0.5:/export/dir2",
        "/m",
    ]
    hard = NFS.model_copy(update={"mount_options": ["hard", "timeo=600", "retrans=2"]})
    assert argv(hard, at, None)[4] == "nosuid,nodev,hard,timeo=600,retrans=2"
    creds = Path("/s/c")
    assert argv(SMB, at, creds)[3:] == [
        "-o",
        "nosuid,nodev,vers=3.0,credentials=/s/c",
        "--",
        "//[fd00::5]/share/dir",
        "/m",
    ]
    guest = SMB.model_copy(update={"username": None})
    assert argv(guest, at, None)[4].endswith(",guest")


def test_the_password_is_in_a_0600_file_only_while_it_is_mounted(tmp_path: Path) -> None:
    d = tmp_path / "creds"
    with credentials_file(d, SMB, "pa ss,word") as path:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(d.stat().st_mode) == 0o700
        assert path.read_text() == "username=alice\npassword=pa ss,word\n"
        assert "pa ss" not in " ".join(argv(SMB, tmp_path, path))
    assert not path.exists()


async def test_options_past_the_allow_list_are_never_mounted(tmp_path: Path) -> None:
    bad = NFS.model_copy(update={"mount_options": ["exec,suid"]})
    with pytest.raises(Unreachable, match="not an allowed nfs mount option"):
        await KernelMounter(tmp_path).mount(bad, tmp_path, None)


def test_the_mount_table_is_read_not_the_mount(tmp_path: Path) -> None:
    table = tmp_path / "mountinfo"
    table.write_text(
        "36 35 98:0 /mnt1 /mnt/with\\040space rw,noatime master:1 - ext3 /dev/root rw\n"
    )
    assert is_mounted(Path("/mnt/with space"), table)
    assert not is_mounted(Path("/mnt/with"), table)
