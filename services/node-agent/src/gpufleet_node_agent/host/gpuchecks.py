"""This node's answers to the control plane's GPU checks (`VerifyGpus`, on its command
stream): the check runs out of the agent's process (`python -m
gpufleet_node_agent.gpucheck`), killed past the command's timeout, and what it found is
published as `GpuCheckReported` on this node's own subject, with the command's nonce.

Simulated GPUs have nothing to check: answered at once, in process. One check at a time
(each takes every free GPU's memory). GPUs held by this node's workers are not measured
(the check would take their memory): the answer says they are in use. A check that fails
to run, prints nothing or runs out of time is answered too, with why, so the provisioner
hears at once instead of at its deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable, Collection, Sequence

from gpufleet_bus.publish import Publisher, publish
from gpufleet_contracts.clock import Clock, utcnow
from gpufleet_contracts.verification import (
    TEXT_CHARS,
    GpuCheck,
    GpuCheckReported,
    VerifyGpus,
)
from pydantic import ValidationError

from ..gpucheck import check
from ..worker.manager import WorkerManager

log = logging.getLogger("gpufleet.node_agent")

SOURCE = "gpufleet/node-agent"
CHECK = (sys.executable, "-m", "gpufleet_node_agent.gpucheck")
# A check's process sees every GPU of the node, whatever the agent's own environment says,
# and none of the agent's settings (its join token among them): it needs none.
HIDDEN = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")
SETTINGS = "GPUFLEET_"
PUBLISH_TRIES = 5


class GpuChecks:
    def __init__(
        self,
        minion_id: str,
        publisher: Publisher,
        simulated: Callable[[], bool],
        in_use: Callable[[], Collection[int]],
        clock: Clock = utcnow,
        command: Sequence[str] = CHECK,
    ) -> None:
        """`simulated`: whether this node's GPUs are; `in_use`: the GPUs its workers hold."""
        self.minion_id = minion_id
        self.publisher = publisher
        self.simulated = simulated
        self.in_use = in_use
        self.clock = clock
        self.command = tuple(command)
        self._one = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()

    async def on_verify_gpus(self, cmd: VerifyGpus) -> None:
        """Start answering (the command is acked at once: a check takes seconds, and the
        commands behind it, a StartWorker among them, must not wait for it)."""
        if cmd.minion_id != self.minion_id:
            log.error("VerifyGpus for minion %s reached %s; ignored", cmd.minion_id, self.minion_id)
            return
        task = asyncio.create_task(self.answer(cmd), name=f"gpu-check-{cmd.check_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def answer(self, cmd: VerifyGpus) -> None:
        async with self._one:
            result = await self.run(cmd)
        report = GpuCheckReported(
            minion_id=self.minion_id,
            check_id=cmd.check_id,
            nonce=cmd.nonce,
            result=result,
            at=self.clock(),
        )
        for attempt in range(1, PUBLISH_TRIES + 1):
            try:
                await publish(
                    self.publisher, report, source=SOURCE, msg_id=f"gpu-checked:{cmd.check_id}"
                )
                break
            except Exception as exc:
                log.warning("GPU check %s not reported (try %d): %s", cmd.check_id, attempt, exc)
                await asyncio.sleep(min(2.0**attempt, 30.0))
        log.info(
            "GPU check %s answered: %d GPUs%s",
            cmd.check_id,
            len(result.gpus),
            f", {result.error}" if result.error else "",
        )

    async def run(self, cmd: VerifyGpus) -> GpuCheck:
        """The check's process, under `cmd.timeout_s`; a GpuCheck saying why when it gave
        none. Simulated GPUs have nothing to check: that answer needs no process."""
        if self.simulated():
            return check(cmd.nonce, simulated=True)
        args = [*self.command, "--nonce", cmd.nonce]
        busy = sorted(self.in_use())
        if busy:
            args += ["--skip", ",".join(str(i) for i in busy)]
        env = {
            k: v for k, v in os.environ.items() if k not in HIDDEN and not k.startswith(SETTINGS)
        }
        try:
            proc = await asyncio.create_subprocess_exec(
                *args,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
                start_new_session=True,  # its own process group: killed whole on timeout
            )
        except OSError as exc:
            return failed(f"the GPU check could not start: {exc}")
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout=cmd.timeout_s)
        except TimeoutError:
            await _kill(proc)
            return failed(f"the GPU check did not finish within {cmd.timeout_s:.0f} s")
        except asyncio.CancelledError:  # the agent stops: the check goes with it
            await _kill(proc)
            raise
        if proc.returncode != 0:
            tail = err.decode(errors="replace").strip().splitlines()[-3:]
            return failed(f"the GPU check exited with status {proc.returncode}: {' | '.join(tail)}")
        lines = out.strip().splitlines()
        try:
            return GpuCheck.model_validate_json(lines[-1] if lines else b"")
        except ValidationError as exc:
            return failed(
                f"the GPU check printed no answer it may give ({exc.error_count()} errors)"
            )

    async def stop(self) -> None:
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def failed(why: str) -> GpuCheck:
    """An answer that says why there is no check result."""
    return GpuCheck(error=why[:TEXT_CHARS])


async def _kill(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    await proc.wait()


def gpus_in_use(workers: WorkerManager) -> set[int]:
    """The GPUs this node's placements hold (each StartWorker's `gpu_indices`, in its
    worker's spec), until their end is reported."""
    used: set[int] = set()
    for w in workers.active.values():
        used.update(w.spec.gpu_indices)
    return used
