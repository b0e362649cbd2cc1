"""The image of a job without an image of its own: Debian bookworm (minbase) with Python 3,
built once per node from Debian's packages and kept in podman's image store.

    mmdebstrap --variant=minbase --include=python3,python-is-python3,... bookworm - \\
        | podman import --change 'CMD ["/bin/bash"]' - gpufleet/base:bookworm-<digest>

Nothing comes from a container registry. The agent builds it the first time a worker needs
it (`ensure_image`); `python -m gpufleet_node_agent.baseimage` builds it ahead of time. Its
tag carries a digest of what it is built from, so a node whose image predates a change to
the package list builds the new one instead of running the old.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

SUITE = "bookworm"
# What a job's command names first: `python` as well as `python3` (python-is-python3); ps,
# top, free and kill (procps) for a command that looks at itself or its children; the CA
# certificates for a job given a network; what an endpoint serves with (R-JOB-7: fastapi,
# pydantic, uvicorn, python-multipart; gpufleet_endpoint's route server runs on them).
# Compilers, git and pip are a job's packages (R-JOB-7), so that every job does not pay for
# them.
PACKAGES = (
    "python3",
    "python-is-python3",
    "procps",
    "ca-certificates",
    "python3-fastapi",
    "python3-uvicorn",
    "python3-pydantic",
    "python3-multipart",
)
INSTALL_HINT = "apt-get install -y podman runc mmdebstrap"


def default_containers_conf() -> Path | None:
    """deploy/podman/containers.conf of a source checkout, if this runs from one."""
    for parent in Path(__file__).resolve().parents:
        candidate = parent / "deploy" / "podman" / "containers.conf"
        if candidate.is_file():
            return candidate
    return None


def podman_env(
    containers_conf: Path | None, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment podman runs with: a plain PATH, gpufleet's containers.conf."""
    env = {
        "PATH": os.environ.get("PATH")
        or "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": os.environ.get("HOME") or "/root",
    }
    if containers_conf is not None:
        env["CONTAINERS_CONF"] = str(containers_conf)
    env.update(extra or {})
    return env


def _rootfs_command(suite: str = SUITE, packages: tuple[str, ...] = PACKAGES) -> str:
    return f"mmdebstrap --quiet --variant=minbase --include={','.join(packages)} {suite} -"


def image_name(suite: str = SUITE, packages: tuple[str, ...] = PACKAGES) -> str:
    """`gpufleet/base:<suite>-<digest of how it is built>`."""
    digest = hashlib.sha256(_rootfs_command(suite, packages).encode()).hexdigest()[:8]
    return f"gpufleet/base:{suite}-{digest}"


BASE_IMAGE = image_name()


def build_script(image: str = BASE_IMAGE) -> str:
    return f"{_rootfs_command()} | podman import --quiet --change 'CMD [\"/bin/bash\"]' - {image}"


async def ensure_image(image: str, env: Mapping[str, str], podman: str = "podman") -> str | None:
    """None when `image` is in the store (built now if it is the base image); else why not."""
    if shutil.which(podman, path=env.get("PATH")) is None:
        return f"podman is not installed: {INSTALL_HINT}"
    exists = await asyncio.create_subprocess_exec(
        podman, "image", "exists", image, env=dict(env), stdin=asyncio.subprocess.DEVNULL
    )
    if await exists.wait() == 0:
        return None
    if image != BASE_IMAGE:
        return f"image {image} is not on this node"
    if shutil.which("mmdebstrap", path=env.get("PATH")) is None:
        return f"cannot build {image}: mmdebstrap is not installed ({INSTALL_HINT})"
    proc = await asyncio.create_subprocess_exec(
        "bash",
        "-o",
        "pipefail",
        "-c",
        build_script(image),
        env=dict(env),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await proc.communicate()
    if proc.returncode != 0:
        tail = err.decode(errors="replace").strip()[-500:]
        return f"cannot build {image} (exit {proc.returncode}): {tail}"
    return None


def main() -> int:
    env = podman_env(default_containers_conf())
    error = asyncio.run(ensure_image(BASE_IMAGE, env))
    if error:
        print(error, file=sys.stderr)
        return 1
    print(f"{BASE_IMAGE} is ready")
    return 0


if __name__ == "__main__":
    sys.exit(main())
