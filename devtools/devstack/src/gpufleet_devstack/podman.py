"""podman, runc, crun and mmdebstrap from Debian: what the node agent's podman runtime needs
(GPUFLEET_WORKER_RUNTIME=podman; services/node-agent/README.md, "Container runtime")."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable

__all__ = ["PODMAN_PACKAGES", "ensure_podman", "missing_podman_tools", "node_runtime_env"]

# podman itself runs containers with runc (deploy/podman/containers.conf: crun, podman's
# default on Debian, refuses these hosts' hybrid cgroups). The agent starts its workers'
# containers with crun where it can (runc.py, cgroupv1.py), else runc: crun is optional.
# nftables: the node agent confines each package build's network with nft (builds.py).
PODMAN_PACKAGES = ("podman", "runc", "mmdebstrap", "nftables")
OPTIONAL_PACKAGES = ("crun",)
INSTALL_HINT = (
    f"install them with `sudo apt-get install -y {' '.join(PODMAN_PACKAGES + OPTIONAL_PACKAGES)}`"
)


COMMANDS = {"nftables": "nft"}  # a package whose command is not named after it


def missing_podman_tools(optional: bool = False) -> list[str]:
    """The packages whose command is not on PATH."""
    wanted = PODMAN_PACKAGES + (OPTIONAL_PACKAGES if optional else ())
    return [p for p in wanted if shutil.which(COMMANDS.get(p, p)) is None]


def ensure_podman(log: Callable[[str], None] = print) -> bool:
    """Install what is missing when we are root; else say exactly what to install. True when
    everything needed is there (crun is not needed). Never fatal: containers fall back to
    bare processes for the node owner's own jobs (node_runtime_env)."""
    missing = missing_podman_tools(optional=True)
    if missing and os.geteuid() == 0:
        cmd = ["apt-get", "install", "-y", *missing]
        log(f"{', '.join(missing)} not found; running: {' '.join(cmd)}")
        if subprocess.run(cmd, check=False).returncode != 0:
            subprocess.run(["apt-get", "update"], check=False)
            subprocess.run(cmd, check=False)
    needed = missing_podman_tools()
    if needed:
        log(f"the podman worker runtime needs {', '.join(needed)}: {INSTALL_HINT}")
    elif missing_podman_tools(optional=True):
        log(f"crun is missing: the node agents start containers with runc ({INSTALL_HINT})")
    return not needed


def node_runtime_env(log: Callable[[str], None] = print) -> dict[str, str]:
    """The runtime settings of `just up`'s node agents: containers (the agent's default) when
    podman can run them here; else the operator's opt-in to run the node owner's own jobs
    (all of `just up`'s) as bare processes, said aloud. A developer's own
    GPUFLEET_ALLOW_BARE_PROCESSES wins."""
    if "GPUFLEET_ALLOW_BARE_PROCESSES" in os.environ:
        return {}
    missing = missing_podman_tools()
    if not missing and os.geteuid() == 0:
        return {}
    why = f"{', '.join(missing)} missing" if missing else "not root (rootless podman is not done)"
    log(
        f"node agent: no containers here ({why}): the node owner's own jobs run as bare "
        "processes (GPUFLEET_ALLOW_BARE_PROCESSES=own-jobs); another account's are refused"
    )
    return {"GPUFLEET_ALLOW_BARE_PROCESSES": "own-jobs"}
