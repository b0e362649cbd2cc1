"""A local OCI registry: Debian's `docker-registry` (the Distribution registry) as a child.

It stands in for Docker Hub, GAR, ECR and NGC in `just up` and the tests: a job's customer
image is pushed to it and the node agent pulls it from there (R-JOB-7). Plain HTTP on
127.0.0.1, so the agent must declare it insecure (GPUFLEET_WORKER_INSECURE_REGISTRIES).
With `users`, it asks for basic auth (an htpasswd file with bcrypt hashes, written here).

`running_registry` and `build_and_push` are what the tests share: a registry for a block, and
a small image built FROM the node's base image (Debian's packages, nothing from any other
registry) pushed to it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import bcrypt
from gpufleet_node_agent.baseimage import BASE_IMAGE, default_containers_conf, podman_env

from gpufleet_devstack._server import ServerProcess
from gpufleet_devstack.processes import DevstackError, free_port

__all__ = [
    "LocalRegistry",
    "build_and_push",
    "ensure_registry",
    "find_registry",
    "running_registry",
]

PACKAGE = "docker-registry"
INSTALL_HINT = f"install it with `sudo apt-get install -y {PACKAGE}`"


def find_registry() -> str | None:
    return shutil.which(PACKAGE) or (
        "/usr/bin/docker-registry" if os.access("/usr/bin/docker-registry", os.X_OK) else None
    )


def ensure_registry(log: Callable[[str], None] = print) -> bool:
    """Install docker-registry when missing and we are root; else say how. Never fatal:
    only customer-image jobs need it."""
    if find_registry():
        return True
    if os.geteuid() != 0:
        log(f"a local image registry needs {PACKAGE}: {INSTALL_HINT}")
        return False
    cmd = ["apt-get", "install", "-y", PACKAGE]
    log(f"{PACKAGE} not found; running: {' '.join(cmd)}")
    if subprocess.run(cmd, check=False).returncode != 0:
        subprocess.run(["apt-get", "update"], check=False)
        subprocess.run(cmd, check=False)
    if find_registry():
        return True
    log(f"still missing {PACKAGE}: {INSTALL_HINT}")
    return False


def htpasswd_line(user: str, password: str) -> str:
    """An htpasswd entry with a bcrypt hash (`$2b$`), the only kind the registry accepts."""
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt()).decode()
    return f"{user}:{hashed}\n"


class LocalRegistry(ServerProcess):
    """docker-registry on `host:port`, storing blobs under `data_dir`; `address` is what an
    image reference starts with (`127.0.0.1:5123/team/image:tag`)."""

    kind = "docker-registry"

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        host: str = "127.0.0.1",
        *,
        users: Mapping[str, str] | None = None,
        start_timeout: float = 15.0,
    ) -> None:
        data_dir = Path(data_dir).absolute()
        super().__init__(
            host=host,
            port=port if port is not None else free_port(host),
            log_file=data_dir.parent / f"{data_dir.name}.registry.log",
            start_timeout=start_timeout,
        )
        self.data_dir = data_dir
        self.users = dict(users or {})
        self.config_file = data_dir.parent / f"{data_dir.name}.registry.yml"
        self.htpasswd = data_dir.parent / f"{data_dir.name}.htpasswd"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def _config(self) -> str:
        auth = (
            f"auth:\n  htpasswd:\n    realm: gpufleet-local\n    path: {self.htpasswd}\n"
            if self.users
            else ""
        )
        return (
            "version: 0.1\n"
            "log:\n  level: warn\n"
            f"storage:\n  filesystem:\n    rootdirectory: {self.data_dir}\n"
            "  delete:\n    enabled: true\n"
            f"http:\n  addr: {self.address}\n"
            f"{auth}"
        )

    def _prepare(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.users:
            self.htpasswd.write_text("".join(htpasswd_line(u, p) for u, p in self.users.items()))
        self.config_file.write_text(self._config())

    def _argv(self) -> list[str]:
        binary = find_registry()
        if binary is None:
            raise FileNotFoundError(f"{PACKAGE} is not installed: {INSTALL_HINT}")
        return [binary, "serve", str(self.config_file)]

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.address}/v2/", timeout=1):
                return True
        except urllib.error.HTTPError as exc:
            return exc.code == 401  # up, and asking for credentials
        except OSError:
            return False

    def __repr__(self) -> str:
        return f"LocalRegistry({self.address}, data_dir={self.data_dir}, running={self.running})"


@contextlib.contextmanager
def running_registry(root: Path, users: Mapping[str, str] | None = None) -> Iterator[LocalRegistry]:
    """A LocalRegistry storing under `root`/data (with basic auth for `users`), stopped
    when the block ends."""
    reg = LocalRegistry(Path(root) / "data", users=users)
    reg.start()
    try:
        yield reg
    finally:
        reg.stop()


def build_and_push(
    reg: LocalRegistry,
    context: Path,
    ref: str,
    files: Mapping[str, str],
    *,
    creds: tuple[str, str] | None = None,
    base: str = f"localhost/{BASE_IMAGE}",
    env: Mapping[str, str] | None = None,
) -> str:
    """Build an image FROM `base` (already in podman's store: `--pull=never`) with `files`
    (name: a shell command, run in `context`, that makes it) at /, push it to `reg` as
    `reg.address/ref` with `creds` (user, password), then remove the local copy, so that a
    worker's pull must fetch it. Returns the full reference."""
    env = dict(env) if env is not None else podman_env(default_containers_conf())
    context.mkdir(parents=True)
    lines = [f"FROM {base}"]
    for target, make in files.items():
        subprocess.run(["bash", "-c", make], cwd=context, check=True)
        lines.append(f"COPY {target} /{target}")
    (context / "Containerfile").write_text("\n".join(lines) + "\n")
    full = f"{reg.address}/{ref}"
    push = ["push", "--quiet", "--tls-verify=false"]
    if creds is not None:
        push += ["--creds", f"{creds[0]}:{creds[1]}"]
    for args in (
        ["build", "--pull=never", "--quiet", "-t", full, str(context)],
        [*push, full],
        ["rmi", full],
    ):
        res = subprocess.run(["podman", *args], env=env, capture_output=True, text=True)
        if res.returncode != 0:
            said = " ".join(args).replace(creds[1], "***") if creds else " ".join(args)
            raise DevstackError(f"podman {said}: {res.stderr}")
    return full
