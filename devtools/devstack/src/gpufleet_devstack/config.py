"""Where `just up` keeps its data and which ports it uses (environment variables)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from gpufleet_devstack.processes import DevstackError

DEFAULT_NATS_PORT: Final = 4333
DEFAULT_MONGO_PORT: Final = 27027
# Fixed, like the others: an image pushed to the local registry today is pulled from the
# same address tomorrow.
DEFAULT_REGISTRY_PORT: Final = 5055
# `just up --data`'s storage servers: S3 on this port, the others on the next six, FTP's
# data connections on base+10..base+19 (gpufleet_devstack.storage.servers.StoragePorts).
DEFAULT_STORAGE_PORT: Final = 5060
# The metrics' history (Prometheus's own default port; another free one if it is taken).
DEFAULT_PROMETHEUS_PORT: Final = 9090


def find_repo_root(start: Path | None = None) -> Path:
    """The nearest directory (from cwd up) that holds a `justfile`; cwd when none does."""
    here = (start or Path.cwd()).absolute()
    for candidate in (here, *here.parents):
        if (candidate / "justfile").is_file() or (candidate / "Justfile").is_file():
            return candidate
    return here


def run_dir_from_env(env: Mapping[str, str] = os.environ) -> Path:
    override = env.get("GPUFLEET_RUN_DIR")
    if override:
        return Path(override).expanduser().absolute()
    return find_repo_root() / ".run"


def port_from_env(name: str, default: int, env: Mapping[str, str] = os.environ) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        port = int(raw)
    except ValueError:
        raise DevstackError(f"{name}={raw!r} is not a port number") from None
    if not 0 < port < 65536:
        raise DevstackError(f"{name}={port} is not a valid port")
    return port
