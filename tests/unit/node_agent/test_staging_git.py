"""How the git fetcher calls git (staging/git.py): which URLs it takes, and that the token
and the ssh key reach git through its environment, never its command line, with the
connection pinned to the checked address."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpufleet_node_agent.staging.git import Git, remote
from gpufleet_node_agent.staging.guard import AddressGuard
from gpufleet_node_agent.staging.registry import Moved, Transfer
from gpufleet_node_agent.steps.base import WorkerFailed


def _unheard(moved: Moved) -> None:
    pass


@pytest.mark.parametrize(
    ("url", "host", "port", "ssh", "ref"),
    [
        ("https://github.com/o/r.git#v1.2", "github.com", 443, False, "v1.2"),
        ("http://10.0.0.5:8080/r.git", "10.0.0.5", 8080, False, None),
        ("ssh://git@github.com:2222/o/r.git#abc1234", "github.com", 2222, True, "abc1234"),
        ("git@github.com:o/r.git", "github.com", 22, True, None),
    ],
)
def test_clone_urls_it_takes(url: str, host: str, port: int, ssh: bool, ref: str | None) -> None:
    r = remote(url)
    assert (r.host, r.port, r.ssh, r.ref) == (host, port, ssh, ref)


@pytest.mark.parametrize("url", ["file:///etc", "ext::sh -c id", "git://host/r.git", "/srv/r.git"])
def test_other_transports_are_refused(url: str) -> None:
    with pytest.raises(WorkerFailed, match="not an http\\(s\\) or ssh clone URL"):
        remote(url)


async def test_the_token_is_a_header_in_gits_environment_and_the_address_is_pinned() -> None:
    git = Git(AddressGuard.of(["10.0.0.0/8"]), Path("/etc/ca.pem"))
    keys = {"git": {"token": "t0ken", "username": "me"}}
    options, env = await git._env(
        remote("https://10.0.0.5/r.git"), keys, Transfer(keys, 1, _unheard)
    )
    assert "http.curloptResolve=10.0.0.5:443:10.0.0.5" in options
    assert {"protocol.allow=never", "http.followRedirects=false"} <= set(options)
    assert "http.sslCAInfo=/etc/ca.pem" in options
    assert not any("t0ken" in o for o in options)
    assert env["GIT_CONFIG_KEY_0"] == "http.extraHeader"
    assert env["GIT_CONFIG_VALUE_0"] == "Authorization: Basic bWU6dDBrZW4="  # me:t0ken


async def test_ssh_uses_the_key_file_and_its_known_hosts(tmp_path: Path) -> None:
    secrets = tmp_path / "secrets" / "ssh"
    secrets.mkdir(parents=True)
    (secrets / "private_key").write_text("KEY")
    (secrets / "known_hosts").write_text("10.0.0.5 ssh-ed25519 AAAA")
    keys = {"ssh": {"private_key": "KEY", "known_hosts": "10.0.0.5 ssh-ed25519 AAAA"}}
    git = Git(AddressGuard.of(["10.0.0.0/8"]))
    t = Transfer(keys, 1, _unheard, worker_dir=tmp_path)
    _, env = await git._env(remote("git@10.0.0.5:o/r.git"), keys, t)
    ssh = env["GIT_SSH_COMMAND"]
    assert f"-i {secrets / 'private_key'}" in ssh
    assert "HostName=10.0.0.5" in ssh and "StrictHostKeyChecking=yes" in ssh
    assert "KEY" not in ssh.replace("private_key", "")
    with pytest.raises(WorkerFailed, match="no ssh key"):
        await git._env(remote("git@10.0.0.5:o/r.git"), {}, Transfer({}, 1, _unheard))
    with pytest.raises(WorkerFailed, match=r"refused address 10\.0\.0\.5: private"):
        await Git(AddressGuard())._env(remote("git@10.0.0.5:o/r.git"), keys, t)
