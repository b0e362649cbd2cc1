"""A fractional GPU's share (R-SCHED-4), enforced: its own MPS control daemon, limited to
the share's SMs and memory, started before the worker runs and quit once it has ended
(host/mps.py; services/node-agent/README.md, "Fractional GPUs")."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ..host.gpu_access import GpuAccess
from ..host.mps import Mps
from .base import StepName, WorkerFailed

if TYPE_CHECKING:
    from ..worker.workdir import Worker


class NodeGpus(Protocol):
    """What the step needs of the node's GPUs (the container runtime's, known once NVML
    has started: the agent's prepare)."""

    gpu: GpuAccess
    mps: Mps | None


class ShareStep:
    """A worker placed with `gpu_fraction` on one real GPU gets its MPS daemon; any other
    worker, nothing (simulated GPUs: only the share's variables, supervise.share_env)."""

    name = StepName.share
    marked = True

    def __init__(self, node: NodeGpus) -> None:
        self.node = node

    def _share(self, w: Worker) -> bool:
        s = w.spec
        return s.gpu_fraction is not None and self.node.gpu.real and len(s.gpu_indices) == 1

    def pipe(self, w: Worker) -> Path | None:
        """The pipe directory its container gets (at mps.MPS_TARGET), if it has a share."""
        if not self._share(w) or self.node.mps is None:
            return None
        return self.node.mps.pipe_dir(w.placement_id)

    async def setup(self, w: Worker) -> None:
        if not self._share(w):
            return
        mps = self.node.mps
        if mps is None:
            raise WorkerFailed("fractional GPU: this node has no MPS set up for its GPUs")
        index = w.spec.gpu_indices[0]
        gpu = self.node.gpu.gpus.get(index)
        if gpu is None:
            raise WorkerFailed(f"GPU index {index} is not on this node")
        fraction = w.spec.gpu_fraction
        assert fraction is not None
        memory = w.spec.gpu_memory_limit_mb or int(gpu.memory_mb * float(fraction))
        error = await asyncio.to_thread(
            mps.start, w.placement_id, gpu.uuid, str(fraction), int(memory)
        )
        if error is not None:
            raise WorkerFailed(error)

    async def teardown(self, w: Worker) -> None:
        mps = self.node.mps
        if mps is not None:
            await asyncio.to_thread(mps.stop, w.placement_id)
