"""A worker's customer image (R-JOB-7): pulled from its registry, checked against the job's
disk, before its container runs (podman.py). A worker without one runs in the node's base
image (baseimage.py).

Every pull goes to the registry, with the job's credential or none: an image another
account pulled before is never reused without the registry saying this job may have it.
The credential (StartWorker's sealed `registry_auth`) waits in the worker's `registry.json`
(0600, written by WorkerManager), becomes a podman auth file (0600) for the one pull, and
both are deleted once it is over. The auth file is always given, empty when the job has no
credential, so podman never falls back to the node's own logins (`podman login`).

`--tls-verify=false` only for the registries the operator declared insecure
(`GPUFLEET_WORKER_INSECURE_REGISTRIES`, e.g. the local one of `just up`).
"""

from __future__ import annotations

import base64
import json
import math
import os
from collections.abc import Awaitable, Collection, Mapping
from pathlib import Path
from typing import Any, Protocol

# one rule for which registry an image is from, the contracts' (the scheduler uses it too)
from gpufleet_contracts.images import DEFAULT_REGISTRY as DEFAULT_REGISTRY
from gpufleet_contracts.images import registry_of as registry_of

from .worker.files import read_json

REGISTRY_FILE = "registry.json"  # the credential, from StartWorker: deleted after the pull
AUTH_FILE = "registry-auth.json"  # podman's auth file for that pull: deleted after it
GB = 10**9  # podman's sizes are decimal


def qualified(image: str) -> str:
    """The reference podman pulls without asking which registry a short name means."""
    if registry_of(image) != DEFAULT_REGISTRY or image.startswith(DEFAULT_REGISTRY + "/"):
        return image
    return f"{DEFAULT_REGISTRY}/{image if '/' in image else 'library/' + image}"


def auth_json(registry: str, auth: Mapping[str, Any] | None) -> dict[str, Any]:
    """podman's auth file for one registry; no entry without a credential."""
    if not auth:
        return {"auths": {}}
    token = base64.b64encode(f"{auth['username']}:{auth['password']}".encode()).decode()
    return {"auths": {registry: {"auth": token}}}


def pull_argv(
    image: str, *, authfile: Path, insecure: Collection[str] = (), podman: str = "podman"
) -> list[str]:
    """`podman pull` of `image` with `authfile` (always), TLS checked unless its registry is
    one the operator declared insecure."""
    argv = [podman, "pull", "--quiet", "--authfile", str(authfile)]
    if registry_of(image) in insecure:
        argv.append("--tls-verify=false")
    return [*argv, qualified(image)]


def size_argv(image: str, podman: str = "podman") -> list[str]:
    return [podman, "image", "inspect", "--format", "{{.Size}}", qualified(image)]


def too_big(size_bytes: int, disk_size_gb: int) -> str | None:
    """Why an image of `size_bytes` is refused for a job of `disk_size_gb`; None if it fits."""
    if size_bytes <= disk_size_gb * GB:
        return None
    shown = math.ceil(size_bytes / GB * 10) / 10
    return f"image of {shown:g} GB does not fit disk_size_gb {disk_size_gb}"


def write_auth_file(path: Path, registry: str, auth: Mapping[str, Any] | None) -> None:
    """The auth file for one pull, 0600 from its creation."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(auth_json(registry, auth), f)


def take_credential(worker_dir: Path) -> dict[str, Any] | None:
    """The worker's registry credential, if StartWorker had one (the file stays until the
    pull is over: an agent restarted meanwhile pulls again with it)."""
    data = read_json(worker_dir / REGISTRY_FILE)
    return data if isinstance(data, dict) and data else None


class Podman(Protocol):
    """How the runtime calls podman (PodmanRuntime._podman): argv after `podman`."""

    def __call__(self, *args: str) -> Awaitable[tuple[int, bytes, bytes]]: ...


async def pull_image(
    podman: Podman,
    worker_dir: Path,
    image: str,
    disk_size_gb: int,
    insecure: Collection[str] = (),
) -> str | None:
    """Pull `image` for the worker of `worker_dir` and check it fits its disk: None, or why
    the worker cannot run (its failure's reason)."""
    registry = registry_of(image)
    authfile = worker_dir / AUTH_FILE
    try:
        write_auth_file(authfile, registry, take_credential(worker_dir))
        argv = pull_argv(image, authfile=authfile, insecure=insecure)
        rc, _, err = await podman(*argv[1:])
    finally:
        authfile.unlink(missing_ok=True)
        (worker_dir / REGISTRY_FILE).unlink(missing_ok=True)
    if rc != 0:
        return f"cannot pull image {image}: {err.decode(errors='replace').strip()[-500:]}"
    return await size_error(podman, image, disk_size_gb)


async def size_error(podman: Podman, image: str, disk_size_gb: int) -> str | None:
    """Why `image` (in the store) does not fit `disk_size_gb`; None if it does."""
    _, out, err = await podman(*size_argv(image)[1:])
    try:
        size = int(out.decode().strip())
    except ValueError:
        return f"cannot read the size of image {image}: {err.decode(errors='replace')[-300:]}"
    return too_big(size, disk_size_gb)
