"""Which runtime runs a worker: the node's runtime policy (README, "Runtime policy").

Issue 14's rule: no job of another account ever runs outside a container. Every worker runs
in a container of the node's container runtime (`podman`), except the jobs of the node's own
account when its operator opted in with `GPUFLEET_ALLOW_BARE_PROCESSES=own-jobs`: those run
as bare host processes (`process`). A job is the node owner's own when both its owner (the
project's account, which pays) and its creator (who wrote the command, R-TEN-1) are the
node's owner; a StartWorker that does not say (from an older scheduler) is another account's.

A worker that must run in a container on a node without a working container runtime is
refused: it is reported `failed` with the reason, and never falls back to a bare process.
An endpoint's worker always runs in a container, the owner's own too: the node's proxy
reaches it only through its container's socket (steps/serve.py).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass

from gpufleet_contracts.jobs import StartWorker

from ..baseimage import INSTALL_HINT

PROCESS = "process"
OWN_JOBS = "own-jobs"


@dataclass(frozen=True)
class Decision:
    runtime: str | None  # the runtime's name; None: refused
    refused: str | None = None  # why, when refused


def container_problem(podman: str, env: Mapping[str, str], uid: int | None = None) -> str | None:
    """Why this node cannot run containers, or None. `uid`: the agent's (its effective one);
    only root's podman is done (its workers' cgroups, disks and mounts), not rootless."""
    if shutil.which(podman, path=env.get("PATH")) is None:
        return f"podman is not installed ({INSTALL_HINT})"
    uid = os.geteuid() if uid is None else uid
    if uid != 0:
        return f"the agent runs as uid {uid}, not root (rootless podman is not done)"
    return None


@dataclass
class RuntimePolicy:
    node_owner: str  # the account this node is enrolled for
    allow_bare: bool = False  # GPUFLEET_ALLOW_BARE_PROCESSES=own-jobs
    container: str = "podman"  # the container runtime's name
    container_error: str | None = None  # why the container runtime does not work here

    def own_job(self, cmd: StartWorker) -> bool:
        return cmd.owner == self.node_owner and cmd.creator == self.node_owner

    def choose(self, cmd: StartWorker) -> Decision:
        own = self.own_job(cmd)
        if own and self.allow_bare and cmd.serving is None:
            return Decision(PROCESS)
        if self.container_error is None:
            return Decision(self.container)
        if cmd.serving is not None:
            why = (
                "endpoints are served from containers only, and this node has no working "
                f"container runtime: {self.container_error}"
            )
            return Decision(None, why)
        if own:
            why = (
                f"this node has no working container runtime: {self.container_error}; "
                f"its operator may run the node owner's own jobs as bare processes with "
                f"GPUFLEET_ALLOW_BARE_PROCESSES={OWN_JOBS}"
            )
        else:
            whose = cmd.owner if cmd.creator in (None, cmd.owner) else f"{cmd.owner}/{cmd.creator}"
            why = (
                f"this node has no working container runtime ({self.container_error}), and "
                f"a job of another account ({whose or 'unknown'}) never runs outside a container"
            )
        return Decision(None, why)
