"""Bare git repositories for the git servers (git_daemon.py, git_http.py, git_ssh.py), which
serve every repository under one root: a repository made here is cloned from each."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

__all__ = ["GIT_ENV", "bare_repo", "ensure_git", "git_program"]

INSTALL_HINT = "install it with `sudo apt-get install -y git`"

# git run by us: no user's or system's configuration, a fixed author.
GIT_ENV: Mapping[str, str] = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_AUTHOR_NAME": "gpufleet devstack",
    "GIT_AUTHOR_EMAIL": "devstack@gpufleet.invalid",
    "GIT_COMMITTER_NAME": "gpufleet devstack",
    "GIT_COMMITTER_EMAIL": "devstack@gpufleet.invalid",
    "PATH": "/usr/local/bin:/usr/bin:/bin",
}


def git_program(name: str) -> str:
    """The path of one of git's programs (`git-daemon`, `git-http-backend`): Debian's git
    has them all."""
    git = shutil.which("git")
    if git is None:
        raise FileNotFoundError(f"git is not installed: {INSTALL_HINT}")
    exec_path = subprocess.run([git, "--exec-path"], capture_output=True, text=True, check=True)
    program = Path(exec_path.stdout.strip()) / name
    if not os.access(program, os.X_OK):
        raise FileNotFoundError(f"{program} is missing: {INSTALL_HINT}")
    return str(program)


def _missing_packages() -> list[str]:
    """Debian's packages of the git servers' programs that are not installed: git (git-daemon,
    git-http-backend), openssh-server (sshd, for git over ssh)."""
    from gpufleet_devstack.storage.git_ssh import sshd_program

    missing = []
    try:
        git_program("git-daemon")
        git_program("git-http-backend")
    except FileNotFoundError:
        missing.append("git")
    try:
        sshd_program()
    except FileNotFoundError:
        missing.append("openssh-server")
    return missing


def ensure_git(log: Callable[[str], None] = print) -> bool:
    """Install Debian's git and openssh-server when missing and we are root; else say how.
    Never fatal: only the git servers need them (and a clone of this repository has git)."""
    missing = _missing_packages()
    if not missing:
        return True
    if os.geteuid() != 0:
        packages = " ".join(missing)
        log(f"the git servers need {packages}: `sudo apt-get install -y {packages}`")
        return False
    cmd = ["apt-get", "install", "-y", *missing]
    log(f"{', '.join(missing)} not found; running: {' '.join(cmd)}")
    if subprocess.run(cmd, check=False).returncode != 0:
        subprocess.run(["apt-get", "update"], check=False)
        subprocess.run(cmd, check=False)
    missing = _missing_packages()
    if missing:
        log(f"still missing after apt-get: {', '.join(missing)}")
        return False
    return True


def _git(*args: str, cwd: Path | None = None) -> None:
    subprocess.run(["git", *args], cwd=cwd, env=dict(GIT_ENV), check=True, capture_output=True)


def bare_repo(
    root: Path, name: str, files: Mapping[str, str], message: str = "initial commit"
) -> Path:
    """`root/name` (a name ending in `.git`), a bare repository whose branch `main` holds
    `files` (path: text) in one commit; one that exists already is left as it is."""
    repo = root / name
    if (repo / "HEAD").is_file():
        return repo
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=".work-") as tmp:
        work = Path(tmp)
        _git("init", "--quiet", "--initial-branch=main", str(work))
        for path, text in files.items():
            target = work / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        _git("add", "--all", cwd=work)
        _git("commit", "--quiet", "-m", message, cwd=work)
        staged = root / f".{name}.tmp"
        _git("clone", "--quiet", "--bare", str(work), str(staged))
        staged.rename(repo)
    return repo
