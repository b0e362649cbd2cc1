"""podman, runc and mmdebstrap from Debian: what the node agent's podman runtime needs
(GPUFLEET_WORKER_RUNTIME=podman; services/node-agent/README.md, "Container runtime")."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable

__all__ = ["PODMAN_PACKAGES", "ensure_podman", "missing_podman_tools", "node_runtime_env"]

# crun, podman's default on Debian, fails on these hosts' hybrid cgroups; runc works.
PODMAN_PACKAGES = ("podman", "runc", "mmdebstrap")
INSTALL_HINT = f"install them with `sudo apt-get install -y {' '.join(PODMAN_PACKAGES)}`"


def missing_podman_tools() -> list[str]:
    return [p for p in PODMAN_PACKAGES if shutil.which(p) is None]


def ensure_podman(log: Callable[[str], None] = print) -> bool:
    """Install what is missing when we are root; else say exactly what to install. True when
    everything is there. Never fatal: only the podman runtime (not the default) needs them."""
    missing = missing_podman_tools()
    if not missing:
        return True
    if os.geteuid() != 0:
        log(f"the podman worker runtime needs {', '.join(missing)}: {INSTALL_HINT}")
        return False
    cmd = ["apt-get", "install", "-y", *missing]
    log(f"{', '.join(missing)} not found; running: {' '.join(cmd)}")
    if subprocess.run(cmd, check=False).returncode != 0:
        subprocess.run(["apt-get", "update"], check=False)
        subprocess.run(cmd, check=False)
    still = missing_podman_tools()
    if still:
        log(f"still missing {', '.join(still)}: {INSTALL_HINT}")
    return not still


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
