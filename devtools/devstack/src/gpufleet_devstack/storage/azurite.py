"""Azure Blob Storage on 127.0.0.1: Azurite's blob service (npm), run with node, its blobs
under `root`; over https when given a certificate (tls.py), as an `azure` path must be.

`just setup` installs Azurite into devtools/devstack/node/node_modules (git-ignored) from
the package.json and package-lock.json beside it: `ensure_azurite`. It runs with telemetry
off (nothing leaves this machine) and without its API-version check, which refuses the
current client's newer version while serving its requests well.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpufleet_devstack.storage.rooted import RootedServer, running
from gpufleet_devstack.storage.tls import LocalTls

__all__ = ["AzureEndpoint", "AzuriteBlob", "ensure_azurite", "find_azurite", "running_azurite"]

NODE_DIR = Path(__file__).resolve().parents[3] / "node"
MAIN = NODE_DIR / "node_modules" / "azurite" / "dist" / "src" / "blob" / "main.js"
INSTALL_HINT = "run `just setup` (npm ci in devtools/devstack/node)"
# Azurite's own account, the one every Azure storage emulator has (a documented key).
ACCOUNT = "devstoreaccount1"
ACCOUNT_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


def _version(package_json: Path) -> str | None:
    try:
        data = json.loads(package_json.read_text())
    except (OSError, ValueError):
        return None
    version = data.get("version") or data.get("dependencies", {}).get("azurite")
    return str(version) if version else None


def find_azurite() -> tuple[str, Path] | None:
    """node and Azurite's blob service script (the version package.json names), or None
    when either is missing."""
    node = shutil.which("node")
    installed = _version(NODE_DIR / "node_modules" / "azurite" / "package.json")
    wanted = _version(NODE_DIR / "package.json")
    if node is None or not MAIN.is_file() or installed != wanted:
        return None
    return node, MAIN


def ensure_azurite(log: Callable[[str], None] = print) -> bool:
    """Install Azurite with npm from the lock file when it is missing (node and npm from
    Debian first, when they are missing and we are root). Never fatal: only the Azure
    storage server needs it."""
    if find_azurite():
        return True
    if shutil.which("npm") is None and os.geteuid() == 0:
        cmd = ["apt-get", "install", "-y", "nodejs", "npm"]
        log(f"npm not found; running: {' '.join(cmd)}")
        if subprocess.run(cmd, check=False).returncode != 0:
            subprocess.run(["apt-get", "update"], check=False)
            subprocess.run(cmd, check=False)
    if shutil.which("npm") is None:
        log("Azurite (the local Azure Blob server) needs node and npm: apt-get install nodejs npm")
        return False
    log(f"installing Azurite into {NODE_DIR}/node_modules (npm ci)")
    cmd = ["npm", "ci", "--omit=dev", "--no-audit", "--no-fund", "--loglevel=error"]
    if subprocess.run(cmd, cwd=NODE_DIR, check=False).returncode != 0 or not find_azurite():
        log(f"Azurite is still missing: {INSTALL_HINT}")
        return False
    return True


@dataclass(frozen=True)
class AzureEndpoint:
    """What an Azure Blob client needs: the account's URL, name and key, and the CA file
    to trust when the URL is https."""

    account_url: str
    account_name: str = ACCOUNT
    account_key: str = ACCOUNT_KEY
    ca_file: Path | None = None

    @property
    def connection_string(self) -> str:
        protocol = self.account_url.split(":", 1)[0]
        return (
            f"DefaultEndpointsProtocol={protocol};AccountName={self.account_name};"
            f"AccountKey={self.account_key};BlobEndpoint={self.account_url};"
        )


class AzuriteBlob(RootedServer):
    """Azurite's blob service on `host:port`, storing under `root`; https with `tls`."""

    kind = "azure blob (azurite)"
    log_name = "azurite"
    start_timeout_s = 30.0

    def __init__(
        self,
        root: Path,
        port: int | None = None,
        host: str = "127.0.0.1",
        *,
        tls: LocalTls | None = None,
        log_file: Path | None = None,
        start_timeout: float | None = None,
    ) -> None:
        super().__init__(root, port, host, log_file=log_file, start_timeout=start_timeout)
        self.tls = tls

    @property
    def endpoint(self) -> AzureEndpoint:
        scheme = "https" if self.tls is not None else "http"
        return AzureEndpoint(
            f"{scheme}://{self.address}/{ACCOUNT}",
            ca_file=self.tls.ca if self.tls is not None else None,
        )

    def _argv(self) -> list[str]:
        found = find_azurite()
        if found is None:
            raise FileNotFoundError(f"Azurite is not installed: {INSTALL_HINT}")
        node, main = found
        argv = [node, str(main), "--blobHost", self.host, "--blobPort", str(self.port)]
        argv += ["--location", str(self.root), "--disableTelemetry", "--skipApiVersionCheck"]
        if self.tls is not None:
            argv += ["--cert", str(self.tls.cert), "--key", str(self.tls.key)]
        return argv

    def _ready(self) -> bool:
        context = ssl.create_default_context(cafile=self.tls.ca) if self.tls else None
        try:  # unsigned: refused (403), which only a server that is up answers
            with urllib.request.urlopen(
                f"{self.endpoint.account_url}?comp=list", timeout=1, context=context
            ):
                return True
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False


def running_azurite(
    root: Path, tls: LocalTls | None = None
) -> contextlib.AbstractContextManager[AzuriteBlob]:
    """An AzuriteBlob storing under `root` (https with `tls`) for a block, stopped when it
    ends."""
    return running(AzuriteBlob(root, tls=tls))
