"""git over ssh on 127.0.0.1: Debian's OpenSSH server (`sshd -D -e`, its own configuration
and ed25519 host key, beside `root`) letting one client key in, as the user running it, to
the git-upload-pack or git-receive-pack of a bare repository under `root` and nothing else
(a forced command: git_ssh_command.py; no shell, no forwarding, no password).

sshd logs in only as a real user: the one running it (root in the tests, allowed by key for
forced commands alone). As root it needs its privilege separation directory, /run/sshd,
which Debian's service unit would make: made here.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from gpufleet_devstack.storage import git_ssh_command
from gpufleet_devstack.storage.repos import INSTALL_HINT as GIT_HINT
from gpufleet_devstack.storage.rooted import RootedServer, running

__all__ = ["GitSsh", "running_git_ssh", "sshd_program"]

INSTALL_HINT = "install it with `sudo apt-get install -y openssh-server`"
PRIVSEP_DIR = Path("/run/sshd")


def sshd_program() -> str:
    """The path of OpenSSH's server (/usr/sbin, often not on a user's PATH)."""
    found = shutil.which("sshd") or shutil.which("sshd", path="/usr/sbin:/usr/local/sbin")
    if found is None:
        raise FileNotFoundError(f"sshd is not installed: {INSTALL_HINT}")
    return str(Path(found).absolute())  # sshd re-executes itself: an absolute path


def _git() -> str:
    git = shutil.which("git")
    if git is None:
        raise FileNotFoundError(f"git is not installed: {GIT_HINT}")
    return git


def _keygen(key: Path, comment: str) -> None:
    """An ed25519 key pair (`key`, `key.pub`), without a passphrase; kept when it exists."""
    if key.is_file() and key.with_suffix(".pub").is_file():
        return
    key.unlink(missing_ok=True)
    ssh_keygen = shutil.which("ssh-keygen")
    if ssh_keygen is None:
        raise FileNotFoundError(f"ssh-keygen is not installed: {INSTALL_HINT}")
    argv = [ssh_keygen, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(key)]
    subprocess.run(argv, check=True, capture_output=True)


class GitSsh(RootedServer):
    """sshd on `host:port`; `url(name)` is a repository's clone URL, `client_key` the private
    key it lets in, `known_hosts(...)` its host key as a client's known_hosts line."""

    kind = "git over ssh (sshd)"
    log_name = "git-ssh"

    def __init__(
        self,
        root: Path,
        port: int | None = None,
        host: str = "127.0.0.1",
        *,
        log_file: Path | None = None,
        start_timeout: float | None = None,
    ) -> None:
        super().__init__(root, port, host, log_file=log_file, start_timeout=start_timeout)
        self.user = pwd.getpwuid(os.getuid()).pw_name
        self.state = self.root.parent / f"{self.root.name}.git-ssh"
        self.host_key = self.state / "host_key"
        self.client_key = self.state / "client_key"
        self.config = self.state / "sshd_config"

    def url(self, name: str) -> str:
        return f"ssh://{self.user}@{self.address}/{name}"

    def known_hosts(self, *names: str) -> str:
        """The host key as a known_hosts line for `names` (by default `[host]:port`, as
        ssh-keyscan writes it). Made at the first start."""
        kind, key = self.host_key.with_suffix(".pub").read_text().split()[:2]
        return f"{','.join(names or (f'[{self.host}]:{self.port}',))} {kind} {key}\n"

    def _prepare(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.state.mkdir(mode=0o700, parents=True, exist_ok=True)
        _keygen(self.host_key, "gpufleet devstack git-ssh host")
        _keygen(self.client_key, "gpufleet devstack git-ssh client")
        forced = [sys.executable, "-I", "-S", git_ssh_command.__file__]
        forced += [str(self.root), _git()]
        command = shlex.join(forced)  # run by the user's login shell
        client = self.client_key.with_suffix(".pub").read_text().strip()
        authorized = self.state / "authorized_keys"
        authorized.write_text(f'restrict,command="{_escaped(command)}" {client}\n')
        self.config.write_text(
            "\n".join(
                [
                    f"ListenAddress {self.host}:{self.port}",
                    f"HostKey {self.host_key}",
                    f"AuthorizedKeysFile {authorized}",
                    f"AllowUsers {self.user}",
                    "PidFile none",
                    "UsePAM no",
                    # the files are in a test's temporary directory, under a world-writable one
                    "StrictModes no",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "PermitRootLogin forced-commands-only",
                    "DisableForwarding yes",
                    "PermitTTY no",
                    "PermitUserEnvironment no",
                    "AcceptEnv GIT_PROTOCOL",  # git's protocol v2
                    "LoginGraceTime 10",
                    "LogLevel VERBOSE",
                    "",
                ]
            )
        )
        if os.geteuid() == 0:
            PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)

    def _argv(self) -> list[str]:
        return [sshd_program(), "-D", "-e", "-f", str(self.config)]

    def _ready(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=1) as sock:
                return sock.recv(8).startswith(b"SSH-2.0-")
        except OSError:
            return False


def _escaped(command: str) -> str:
    """`command` inside authorized_keys' `command="..."`."""
    return command.replace("\\", "\\\\").replace('"', '\\"')


def running_git_ssh(root: Path) -> contextlib.AbstractContextManager[GitSsh]:
    """A GitSsh serving the bare repositories under `root`, for a block."""
    return running(GitSsh(root))
