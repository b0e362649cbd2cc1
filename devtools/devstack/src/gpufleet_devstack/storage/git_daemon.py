"""git over the git:// protocol on 127.0.0.1: `git daemon` serving every bare repository
under `root` (export-all), push included (receive-pack): no authentication, as git://
has none. Run as git's own `git-daemon` program: the `git daemon` wrapper would be a
second process, which a SIGKILL of the first leaves behind on the port."""

from __future__ import annotations

import contextlib
from pathlib import Path

from gpufleet_devstack.storage.repos import git_program
from gpufleet_devstack.storage.rooted import RootedServer, running

__all__ = ["GitDaemon", "running_git_daemon"]


class GitDaemon(RootedServer):
    """`git daemon` on `host:port`; `url(name)` is a repository's clone URL."""

    kind = "git daemon"
    log_name = "git-daemon"

    def url(self, name: str) -> str:
        return f"git://{self.address}/{name}"

    def _argv(self) -> list[str]:
        return [
            git_program("git-daemon"),
            "--reuseaddr",
            "--export-all",
            "--enable=receive-pack",
            "--informative-errors",
            f"--listen={self.host}",
            f"--port={self.port}",
            f"--base-path={self.root}",
            str(self.root),
        ]

    def _ready(self) -> bool:
        return True  # it accepts connections once it serves


def running_git_daemon(root: Path) -> contextlib.AbstractContextManager[GitDaemon]:
    """A GitDaemon serving the bare repositories under `root`, for a block."""
    return running(GitDaemon(root))
