"""A real nats-server (the Debian package's binary) with JetStream, as a child process."""

from __future__ import annotations

import os
import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from gpufleet_devstack._server import ServerProcess
from gpufleet_devstack.processes import DevstackError, free_port, port_in_use

__all__ = ["NatsServer", "NatsServerNotFoundError", "ensure_nats_server", "find_nats_server"]

_FALLBACK_PATHS = ("/usr/sbin/nats-server", "/usr/bin/nats-server", "/usr/local/bin/nats-server")
INSTALL_HINT = "install it with `sudo apt-get install nats-server`"


class NatsServerNotFoundError(DevstackError):
    """The nats-server binary is not installed."""


def find_nats_server() -> str | None:
    """Path of the nats-server binary, or None."""
    found = shutil.which("nats-server")
    if found:
        return found
    for candidate in _FALLBACK_PATHS:
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def ensure_nats_server(log: Callable[[str], None] = print) -> str:
    """Return the nats-server binary path, installing the Debian package when we are root."""
    found = find_nats_server()
    if found:
        return found
    if os.geteuid() != 0:
        raise NatsServerNotFoundError(f"nats-server is not installed: {INSTALL_HINT}")
    for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "nats-server"]):
        log(f"nats-server not found; running: {' '.join(cmd)}")
        result = subprocess.run(cmd, check=False)
        if result.returncode != 0:
            raise NatsServerNotFoundError(
                f"`{' '.join(cmd)}` failed with exit code {result.returncode}; {INSTALL_HINT}"
            )
    found = find_nats_server()
    if not found:
        raise NatsServerNotFoundError(
            f"nats-server still not found after apt-get install; {INSTALL_HINT}"
        )
    return found


class NatsServer(ServerProcess):
    """nats-server with JetStream on `host:port`, storing streams under `store_dir`.

    `restart()` reuses the port and the store dir, so JetStream data survives `kill()`.
    The log (stdout+stderr of the server) goes to `log_file`, by default
    `<store_dir>.nats.log` next to the store dir.
    """

    kind = "nats-server"

    def __init__(
        self,
        store_dir: Path,
        port: int | None = None,
        host: str = "127.0.0.1",
        *,
        log_file: Path | None = None,
        binary: str | None = None,
        extra_args: Sequence[str] = (),
        start_timeout: float = 15.0,
    ) -> None:
        store_dir = Path(store_dir).absolute()
        super().__init__(
            host=host,
            port=port if port is not None else free_port(host),
            log_file=Path(log_file)
            if log_file
            else store_dir.parent / f"{store_dir.name}.nats.log",
            start_timeout=start_timeout,
        )
        self.store_dir = store_dir
        self.binary = binary
        self.extra_args = list(extra_args)
        self.monitor_port = self._monitor_port()

    def _monitor_port(self) -> int:
        """A free port other than the client port: two `free_port` calls in a row can get
        the same one (the kernel hands a released port out again), and nats-server, which
        binds the monitor first, then failed on its client port (seen once in the suite)."""
        while (port := free_port(self.host)) == self.port:
            pass
        return port

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    @property
    def monitor_url(self) -> str:
        return f"http://{self.host}:{self.monitor_port}"

    def _prepare(self) -> None:
        if self.binary is None:
            self.binary = ensure_nats_server()
        self.store_dir.mkdir(parents=True, exist_ok=True)
        if self.monitor_port == self.port or port_in_use(self.monitor_port, self.host):
            self.monitor_port = self._monitor_port()

    def _argv(self) -> list[str]:
        return [
            self.binary or "nats-server",
            "-a", self.host,
            "-p", str(self.port),
            "-js",
            "-sd", str(self.store_dir),
            "-m", str(self.monitor_port),
            *self.extra_args,
        ]  # fmt: skip

    def _ready(self) -> bool:
        url = f"{self.monitor_url}/healthz?js-enabled-only=true"
        try:
            with urllib.request.urlopen(url, timeout=0.5) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def __repr__(self) -> str:
        return f"NatsServer({self.url}, store_dir={self.store_dir}, running={self.running})"
