"""The image a container worker runs in, made ready before it runs (R-JOB-7): the node's
base image made sure of, once per node; then, when the worker needs more than the base
image, its own image pulled or its base environment and packages built (prepare.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ..baseimage import ensure_image
from ..builds import Builder, Podman
from ..prepare import needs_preparing, prepare_image
from ..runtimes.podman_args import PodmanConfig
from .base import StepName, WorkerFailed

if TYPE_CHECKING:
    from ..worker.workdir import Worker

log = logging.getLogger("gpufleet.node_agent.podman")


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
        await self._base_image()
        if not needs_preparing(w.spec, self.config):
            return
        try:
            image, error = await prepare_image(self.podman, self.builder, w, self.config)
        except Exception as exc:  # podman gone, say: the worker fails, saying so
            raise WorkerFailed(f"cannot prepare the worker's image: {exc}") from exc
        if error is not None:
            raise WorkerFailed(error)
        w.made[self.name] = image

    async def teardown(self, w: Worker) -> None:
        """Nothing: an image stays in the node's store for the next worker (its credential,
        if a pull never took it, goes with the keys step's teardown)."""
