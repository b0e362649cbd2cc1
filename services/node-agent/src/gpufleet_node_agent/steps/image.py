"""The image a container worker runs in, made ready before it runs (R-JOB-7): the node's
base image made sure of, once per node; then, when the worker needs more than the base
image, its own image pulled or its base environment and packages built (prepare.py), a
requirements.txt at the top of its model code among them: the step runs after the inputs
step, which staged that code."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import stat
from collections.abc import Mapping
from typing import TYPE_CHECKING

from gpufleet_contracts import limits
from gpufleet_contracts.jobs import MountKind

from ..baseimage import ensure_image
from ..builds import Builder, Podman
from ..packages import ModelRequirements, UnsafeRequirement, model_requirements
from ..prepare import needs_preparing, prepare_image
from ..runtimes.podman_args import PodmanConfig
from ..worker.layout import mount_dir
from .base import StepName, WorkerFailed

if TYPE_CHECKING:
    from ..worker.workdir import Worker

log = logging.getLogger("gpufleet.node_agent.podman")

REQUIREMENTS = "requirements.txt"
# The most a model's requirements.txt may hold: a spec's `packages.requirements` at its
# longest (its entries at their longest, one line each), with room for comments.
REQUIREMENTS_BYTES = 4 * limits.PACKAGES * (limits.PACKAGE_CHARS + 1)


def staged_requirements(w: Worker) -> ModelRequirements | None:
    """The requirements.txt at the top of the worker's staged model code, each line checked
    as `packages.requirements` is (packages.model_requirements); None without model code or
    without the file. Its content is the job's, untrusted: a symlink is not followed, and
    anything but a regular UTF-8 file of at most REQUIREMENTS_BYTES fails the worker."""
    model = next((m for m in w.spec.mounts if m.kind is MountKind.model and m.source), None)
    if model is None:
        return None
    shown = f"{model.target.rstrip('/')}/{REQUIREMENTS}"
    path = mount_dir(w.dir, model.target) / REQUIREMENTS
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        why = "a symlink, not followed" if exc.errno == errno.ELOOP else exc.strerror
        raise WorkerFailed(f"the model code's {shown} cannot be read: {why}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # a directory, a FIFO (not waited on)...
        os.close(fd)
        raise WorkerFailed(f"the model code's {shown} is not a regular file")
    with os.fdopen(fd, "rb") as f:
        data = f.read(REQUIREMENTS_BYTES + 1)
    if len(data) > REQUIREMENTS_BYTES:
        raise WorkerFailed(f"the model code's {shown} is larger than {REQUIREMENTS_BYTES} bytes")
    try:
        return model_requirements(shown, data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise WorkerFailed(f"the model code's {shown} is not UTF-8 text: {exc.reason}") from None
    except UnsafeRequirement as exc:
        raise WorkerFailed(exc.reason) from None


class ImageStep:
    """Its done-marker keeps the image prepared for the worker (`image`), so that a
    restarted agent launches it in that image without pulling or building it again."""

    name = StepName.image
    marked = True

    def __init__(
        self, podman: Podman, builder: Builder, config: PodmanConfig, env: Mapping[str, str]
    ) -> None:
        self.podman = podman
        self.builder = builder
        self.config = config
        self.env = env  # podman's (baseimage.podman_env)
        self._base_ok = False
        self._base: asyncio.Task[str | None] | None = None  # the node's base image, once

    def image(self, w: Worker) -> str | None:
        """The image prepared for `w`; None: its spec's, or the node's base image."""
        return w.made.get(self.name) or None

    async def _base_image(self) -> None:
        """The node's base image in podman's store (built when missing), made sure of once:
        the workers that come meanwhile wait for the same check."""
        if self._base_ok:
            return
        if self._base is None:
            log.info("making sure image %s is here (built once per node)", self.config.image)
            self._base = asyncio.ensure_future(
                ensure_image(self.config.image, self.env, self.config.podman)
            )
        task = self._base
        error = await asyncio.shield(task)
        if error is not None:
            if self._base is task:
                self._base = None  # the next worker tries again
            raise WorkerFailed(error)
        self._base_ok = True

    async def setup(self, w: Worker) -> None:
        model = staged_requirements(w)  # one small file: refused before anything is built
        await self._base_image()
        if not needs_preparing(w.spec, self.config, model):
            return
        try:
            image, error = await prepare_image(self.podman, self.builder, w, self.config, model)
        except Exception as exc:  # podman gone, say: the worker fails, saying so
            raise WorkerFailed(f"cannot prepare the worker's image: {exc}") from exc
        if error is not None:
            raise WorkerFailed(error)
        w.made[self.name] = image

    async def teardown(self, w: Worker) -> None:
        """Nothing: an image stays in the node's store for the next worker (its credential,
        if a pull never took it, goes with the keys step's teardown)."""
