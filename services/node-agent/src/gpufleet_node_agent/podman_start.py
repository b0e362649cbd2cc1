"""The podman runtime's launching half (PodmanRuntime in podman.py is the rest): the base
image made sure of once per node, a job's own image pulled, its base environment and
packages built (prepare.py), its disk quota set up (disk.py), a fractional share's MPS
daemon started (mps.py), then `podman run --detach`, several at once.

Launches run as tasks beside the watch rounds, at most `PodmanConfig.parallel` `podman run`s
at a time (each is ~0.2-0.4 s, mostly waiting for storage and runc: one after another a node
could start only ~3 containers a second, issue 15). Once a container runs, its conmon is
watched (its pid from `--conmon-pidfile`, procwatch.py): conmon exits once the container
has ended and podman has recorded it, which is when the agent asks podman how it ended.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Coroutine, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from . import disk, procwatch
from .baseimage import ensure_image
from .builds import Builder
from .files import read_int, read_json, write_json_atomic
from .gpu_access import GpuAccess
from .images import REGISTRY_FILE
from .mps import Mps
from .podman_args import (
    ContainerSpec,
    PodmanConfig,
    container_name,
    container_spec,
    ml_binds,
    run_argv,
    share_limits,
)
from .prepare import needs_preparing, prepare_image
from .runc import Runc
from .workdir import Worker, proc_args

log = logging.getLogger("gpufleet.node_agent.podman")

MARKER = "container.json"
ENV_FILE = "podman.env"
CONMON_PID = "conmon.pid"


def _now() -> str:
    return datetime.now(UTC).isoformat()


class ContainerStarts:
    """What PodmanRuntime (podman.py) sets; the launching of its workers."""

    config: PodmanConfig
    minion_id: str
    env: dict[str, str]
    gpu: GpuAccess
    mps: Mps | None
    node_gpus: int
    node_cpus: int | None
    cpu_job_cpus: int
    builder: Builder
    runc: Runc
    use_runc: bool  # new containers are started with runc where it can (runc.py)
    notify: Callable[[], None]
    _pending: dict[str, Worker]
    _pulling: set[str]  # placements whose image is being prepared
    _starting: set[str]  # placements whose `podman run` has not returned yet
    _ended: set[str]  # placements whose conmon (or runc supervisor) is gone: how did they end?
    _unwatched: set[str]  # placements whose conmon cannot be watched: checked every round
    _tasks: set[asyncio.Task[Any]]
    _limit: asyncio.Semaphore | None
    _image_ok: bool
    _image_task: asyncio.Task[str | None] | None

    async def _podman(
        self, *args: str, env: Mapping[str, str] | None = None, cwd: Path | None = None
    ) -> tuple[int, bytes, bytes]:
        raise NotImplementedError

    @staticmethod
    def container_of(w: Worker) -> str:
        return container_name(w.job_id, w.worker, w.placement_id)

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _launching(self, w: Worker) -> bool:
        p = w.placement_id
        return p in self._pending or p in self._pulling or p in self._starting

    # --- conmon -----------------------------------------------------------------------

    def watch_conmon(self, w: Worker) -> None:
        """Hear of the container's end when its conmon exits; without a pidfd (or a conmon
        pid), every round's listing checks on it instead."""
        name = self.container_of(w)
        pid = read_int(w.file(CONMON_PID))
        if pid is None:
            self._unwatched.add(w.placement_id)
            return
        args = proc_args(pid)
        if not args or f"{name}" not in args:  # gone already (or the pid is another's)
            self._conmon_gone(w.placement_id)
            return
        if not procwatch.watch(pid, lambda: self._conmon_gone(w.placement_id)):
            self._unwatched.add(w.placement_id)

    def _conmon_gone(self, placement_id: str) -> None:
        self._ended.add(placement_id)
        self.notify()

    # --- launching --------------------------------------------------------------------

    async def _launch_pending(self) -> None:
        if not self._pending:
            return
        if not self._image_ok:
            if self._image_task is None:
                log.info("making sure image %s is here (built once per node)", self.config.image)
                self._image_task = asyncio.ensure_future(
                    ensure_image(self.config.image, self.env, self.config.podman)
                )
                self._image_task.add_done_callback(lambda _: self.notify())
            if not self._image_task.done():
                return  # building: the workers wait
            error, self._image_task = self._image_task.result(), None
            if error is not None:
                for w in self._take_pending():
                    self._fail(w, error)
                return
            self._image_ok = True
        for w in self._take_pending():
            spec = read_json(w.file("spec.json")) or {}
            if needs_preparing(spec, self.config):
                self._pulling.add(w.placement_id)
                self._spawn(self._prepare_then_start(w, spec))
            else:
                self._starting.add(w.placement_id)
                self._spawn(self._start(w))

    async def _start(self, w: Worker) -> None:
        try:
            await self.start_container(w)
        except Exception as exc:  # podman gone, say: the worker fails, saying so
            self._fail(w, f"cannot start its container: {exc}")
        finally:
            self._starting.discard(w.placement_id)
            self.notify()

    async def _prepare_then_start(self, w: Worker, spec: dict[str, Any]) -> None:
        """Its image pulled, its environment and packages built (prepare.py; in the
        background: other workers go on being watched), then its container."""
        try:
            if w.file("exit.json").exists() or w.file("stop_requested").exists():
                w.file(REGISTRY_FILE).unlink(missing_ok=True)
                await self.start_container(w)  # records the stop
                return
            image, error = await prepare_image(self._podman, self.builder, w, spec, self.config)
            if error is not None:
                w.file("env.json").unlink(missing_ok=True)
                self._fail(w, error)
                return
            await self.start_container(w, image)
        except Exception as exc:  # podman gone, say: the worker fails, saying so
            w.file(REGISTRY_FILE).unlink(missing_ok=True)
            self._fail(w, f"cannot prepare the worker's image: {exc}")
        finally:
            self._pulling.discard(w.placement_id)
            self.notify()

    def _take_pending(self) -> list[Worker]:
        taken = list(self._pending.values())
        self._pending.clear()
        return taken

    def _fail(self, w: Worker, error: str) -> None:
        disk.release(w.dir)  # never ran: nothing much to keep
        if self.mps is not None:
            self.mps.stop(w.placement_id)
        write_json_atomic(
            w.file("exit.json"), {"exit_code": None, "ended_at": _now(), "error": error}
        )
        log.warning("worker %s not started: %s", w.key, error)

    def _prepare_dirs(self, w: Worker) -> None:
        """The host directories its binds need. With the disk quota the writable ones are
        on its own filesystem (disk.py), which `release` keeps in these when they hold
        anything: not made here (issue 15: a directory made costs the node's disk a write)."""
        for b in ml_binds(w.dir):
            if self.config.disk_quota and not b.read_only:
                continue
            b.host.mkdir(parents=True, exist_ok=True)
            if not b.read_only and os.geteuid() == 0:
                os.chown(b.host, self.config.uid, self.config.uid)

    async def start_container(self, w: Worker, image: str | None = None) -> None:
        spec = read_json(w.file("spec.json"))
        env_path = w.file("env.json")
        job_env = {str(k): str(v) for k, v in (read_json(env_path) or {}).items()}
        if w.file("exit.json").exists():
            return
        if w.file("stop_requested").exists():
            write_json_atomic(
                w.file("exit.json"), {"exit_code": None, "ended_at": _now(), "stopped": True}
            )
            env_path.unlink(missing_ok=True)
            return
        if spec is None or not spec.get("command"):
            self._fail(w, "spec.json is missing or has no command")
            return
        self._prepare_dirs(w)
        if self.config.disk_quota:
            gb = spec.get("disk_size_gb")
            error = await asyncio.to_thread(disk.setup, w.dir, gb, self.config.uid)
            if error is not None:
                env_path.unlink(missing_ok=True)
                self._fail(w, error)
                return
        gpus = len(spec.get("gpu_indices") or [])
        share = await self._start_share(w, spec)
        if isinstance(share, str):
            env_path.unlink(missing_ok=True)
            self._fail(w, share)
            return
        c = container_spec(
            spec,
            w.dir,
            self.minion_id,
            self.config,
            job_env=job_env,
            gpu=self.gpu,
            mps_pipe=share,
            limits=share_limits(
                self.config,
                self.node_gpus,
                gpus,
                node_cpus=self.node_cpus,
                cpu_job_cpus=self.cpu_job_cpus,
                cpu_count=int(spec.get("cpu_count") or 0),
            ),
            image=image,
        )
        if self.use_runc and Runc.unsuited(c) is None:
            await self._start_runc(w, c, check=image is not None)
            return
        write_json_atomic(w.file(MARKER), {"name": c.name, "image": c.image})
        if self._limit is None:
            self._limit = asyncio.Semaphore(max(1, self.config.parallel))
        try:
            async with self._limit:
                rc, _, err = await self._run(c, w)
        finally:
            env_path.unlink(missing_ok=True)  # the values now live only in the container
        if rc != 0:
            await self._podman("rm", "--force", c.name)
            await self._end_share(w)
            self._fail(
                w, f"podman run failed ({rc}): {err.decode(errors='replace').strip()[-500:]}"
            )
            return
        write_json_atomic(
            w.file("started.json"), {"pid": None, "started_at": _now(), "container": c.name}
        )
        self.watch_conmon(w)
        log.info("started container %s for worker %s", c.name, w.key)

    async def _start_runc(self, w: Worker, c: ContainerSpec, check: bool) -> None:
        """Start it with runc on its image's node root (runc.py); `check`: its image was
        prepared for it (pulled, say), the root must be of the image the tag names now."""
        try:
            root = await self.runc.node_root(c.image, check)
            error = root if isinstance(root, str) else self.runc.launch(w, c, root, self.ended(w))
        finally:
            w.file("env.json").unlink(missing_ok=True)  # the values are in its bundle now
        if error is not None:
            await self._end_share(w)
            self._fail(w, error)
            return
        log.info("started container %s for worker %s (runc)", c.name, w.key)

    def ended(self, w: Worker) -> Callable[[], None]:
        """What to call when `w`'s container has ended: the next round asks how."""
        return lambda: self._conmon_gone(w.placement_id)

    async def _start_share(self, w: Worker, spec: dict[str, Any]) -> Path | str | None:
        """A fractional worker on a real GPU: its MPS daemon, limited (mps.py); the pipe
        directory the container gets, or why it cannot run. None for any other worker."""
        fraction = spec.get("gpu_fraction")
        indices = [int(i) for i in spec.get("gpu_indices") or []]
        if fraction in (None, "") or not self.gpu.real or len(indices) != 1:
            return None
        if self.mps is None:
            return "fractional GPU: this node has no MPS set up for its GPUs"
        gpu = self.gpu.gpus.get(indices[0])
        if gpu is None:
            return f"GPU index {indices[0]} is not on this node"
        memory = spec.get("gpu_memory_limit_mb") or int(gpu.memory_mb * float(fraction))
        error = await asyncio.to_thread(
            self.mps.start, w.placement_id, gpu.uuid, str(fraction), int(memory)
        )
        return error if error is not None else self.mps.pipe_dir(w.placement_id)

    async def _end_share(self, w: Worker) -> None:
        if self.mps is not None:
            await asyncio.to_thread(self.mps.stop, w.placement_id)

    async def _run(self, c: ContainerSpec, w: Worker) -> tuple[int, bytes, bytes]:
        env = dict(self.env)
        env.update({k: c.env[k] for k in c.by_name})
        env_file = w.file(ENV_FILE) if c.in_file else None
        if env_file is not None:
            bad = [k for k in c.in_file if "\n" in c.env[k]]
            if bad:
                return 1, b"", f"env {bad}: a multi-line value under a name podman reads".encode()
            fd = os.open(env_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.writelines(f"{k}={c.env[k]}\n" for k in c.in_file)
        try:
            # conmon, started by `podman run`, keeps its working directory: where it writes
            # an `oom` file when the kernel kills the container for memory (OOM_EVIDENCE).
            argv = run_argv(c, self.config.podman, env_file, w.file(CONMON_PID))[1:]
            return await self._podman(*argv, env=env, cwd=w.dir)
        finally:
            if env_file is not None:
                env_file.unlink(missing_ok=True)
