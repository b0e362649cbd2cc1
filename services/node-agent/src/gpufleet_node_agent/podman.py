"""The podman runtime: each worker in its own container, through the podman CLI.

conmon, not the agent, is the container's parent, so a worker outlives an agent restart.
Beside the files of the supervisor protocol, a podman worker's directory has:

    container.json   {name, image}: written before `podman run`; a worker with it and no
                     container (and no exit.json) was lost
    container.log    conmon's log (k8s-file format), converted into `log`
    container.log.offset  bytes of container.log already converted

Per watch round (`poll`): the workers StartWorker handed over are launched (the base image
built first, once per node; then, in the background, a job's own image pulled, its base
environment and packages built: prepare.py),
one `podman ps` lists this node's containers (by label), a running one with a stop request
is stopped, an ended one is inspected (exit code, out of
memory), its end written to exit.json, and it is removed. A worker whose container is gone
without an end is reported lost. A worker's disk quota (disk.py) is set up before its
container runs and released (its output kept) before its end is written.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from . import disk
from .baseimage import ensure_image, podman_env
from .builds import Builder
from .files import read_int, read_json, write_json_atomic, write_text_atomic
from .gpu_access import GpuAccess
from .images import REGISTRY_FILE
from .mps import Mps
from .podman_args import (
    LABEL,
    LOG_FILE,
    ContainerSpec,
    PodmanConfig,
    container_name,
    container_spec,
    convert_k8s_log,
    ml_binds,
    run_argv,
    share_limits,
)
from .prepare import needs_preparing, prepare_image
from .workdir import Worker

log = logging.getLogger("gpufleet.node_agent.podman")

MARKER = "container.json"
ENV_FILE = "podman.env"
OOM = "out of memory"
OOM_EVIDENCE = "oom"  # conmon writes it in its working directory on an OOM kill
ALIVE_STATES = frozenset({"running", "paused", "stopping", "removing", "initialized"})


def _now() -> str:
    return datetime.now(UTC).isoformat()


class PodmanRuntime:
    name = "podman"
    pulls_images = True
    lost_at_restart = "worker lost: its container was gone when the agent restarted"
    lost_at_runtime = "worker lost: its container is gone (its runtime state was removed)"

    def __init__(
        self,
        config: PodmanConfig,
        minion_id: str,
        *,
        gpu: GpuAccess | None = None,
        mps: Mps | None = None,
    ) -> None:
        self.config = config
        self.minion_id = minion_id
        # the agent sets these three from the inventory (prepare)
        self.gpu = gpu or GpuAccess.none()
        self.mps = mps  # fractional shares of real GPUs; None: no real GPUs
        self.secrets_uid = config.uid  # the worker's user reads its attached keys
        self.node_gpus = 0
        self.node_cpus: int | None = None  # None: this machine's
        self.cpu_job_cpus = 0  # of those, offered to CPU-only jobs
        self.env = podman_env(config.containers_conf)
        self._pending: dict[str, Worker] = {}
        self._pulling: set[str] = set()  # placements whose image is being prepared
        self._listing: dict[str, dict[str, Any]] | None = None  # by name; None: unknown
        self._listed_at = 0.0
        self._stopping: set[str] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._image_ok = False
        self._image_task: asyncio.Task[str | None] | None = None
        self.builder = Builder(self._podman, config.podman, self.env, config.build)

    @staticmethod
    def container_of(w: Worker) -> str:
        return container_name(w.job_id, w.worker, w.placement_id)

    # --- the port's quick half ----------------------------------------------------------

    def launch(self, w: Worker) -> str | None:
        self._pending[w.placement_id] = w  # launched by the next poll
        return None

    def _launching(self, w: Worker) -> bool:
        return w.placement_id in self._pending or w.placement_id in self._pulling

    def launched(self, w: Worker) -> bool:
        return self._launching(w) or w.file(MARKER).exists()

    def alive(self, w: Worker) -> bool:
        if self._launching(w) or self._listing is None:
            return True
        return self.container_of(w) in self._listing

    def request_stop(self, w: Worker) -> None:
        """Nothing now: the next poll stops a running container with `stop_requested`."""

    def reattach(self, w: Worker) -> bool:
        if not w.file(MARKER).exists():  # accepted, never launched: launch it now
            self._pending[w.placement_id] = w
            return True
        listing = self._list_sync()
        return listing is None or self.container_of(w) in listing

    def kill_orphan(self, w: Worker) -> None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(
                [self.config.podman, "rm", "--force", self.container_of(w)],
                env=self.env,
                capture_output=True,
                timeout=60,
                check=False,
            )
        disk.release(w.dir)
        if self.mps is not None:
            self.mps.stop(w.placement_id)

    # --- podman calls -----------------------------------------------------------------

    async def _podman(
        self, *args: str, env: Mapping[str, str] | None = None, cwd: Path | None = None
    ) -> tuple[int, bytes, bytes]:
        proc = await asyncio.create_subprocess_exec(
            self.config.podman,
            *args,
            env=dict(env or self.env),
            cwd=cwd,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await proc.communicate()
        return proc.returncode or 0, out, err

    def _ps_args(self) -> list[str]:
        return ["ps", "--all", "--filter", f"label={LABEL}.minion={self.minion_id}"]

    @staticmethod
    def _by_name(out: bytes) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        for c in json.loads(out or b"[]") or []:
            for name in c.get("Names") or []:
                found[str(name)] = c
        return found

    async def _list(self) -> dict[str, dict[str, Any]] | None:
        rc, out, err = await self._podman(*self._ps_args(), "--format", "json")
        if rc != 0:
            log.warning("podman ps failed (%d): %s", rc, err.decode(errors="replace").strip())
            return None
        return self._by_name(out)

    def _list_sync(self) -> dict[str, dict[str, Any]] | None:
        """One listing for all of a restart's reattach() calls."""
        if time.monotonic() - self._listed_at < 2.0:
            return self._listing
        try:
            res = subprocess.run(
                [self.config.podman, *self._ps_args(), "--format", "json"],
                env=self.env,
                capture_output=True,
                timeout=60,
                check=False,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("podman ps failed: %s", exc)
            return None
        self._listing = self._by_name(res.stdout) if res.returncode == 0 else None
        self._listed_at = time.monotonic()
        return self._listing

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- the watch round --------------------------------------------------------------

    async def poll(self, workers: Sequence[Worker]) -> None:
        await self._launch_pending()
        if not workers and not self._stopping:
            return
        listing = await self._list()
        self._listing, self._listed_at = listing, time.monotonic()
        if listing is None:
            return
        ours = {self.container_of(w): w for w in workers}
        for name, c in listing.items():
            w = ours.get(name)
            state = str(c.get("State") or "").lower()
            if w is None:
                if state not in ALIVE_STATES and name not in self._stopping:
                    self._spawn(self._podman("rm", "--force", name))  # an old, ended one
                continue
            self.convert_log(w)
            if w.file("exit.json").exists():
                self._spawn(self._remove(w, name))
            elif state in ALIVE_STATES:
                if w.file("stop_requested").exists() and name not in self._stopping:
                    self._stopping.add(name)
                    self._spawn(self._stop(name))
            else:
                await self._record_end(w, name, state)

    async def _remove(self, w: Worker, name: str) -> None:
        await self._podman("rm", "--force", name)
        await asyncio.to_thread(disk.release, w.dir)  # a crash left it, say

    async def _stop(self, name: str) -> None:
        try:
            await self._podman("stop", "--time", str(self.config.stop_grace_s), name)
        finally:
            self._stopping.discard(name)

    def convert_log(self, w: Worker) -> None:
        """Append what conmon logged since the last call to `log` (shipped by reports.py)."""
        path = w.file(LOG_FILE)
        offset = read_int(w.file(f"{LOG_FILE}.offset")) or 0
        try:
            with path.open("rb") as f:
                f.seek(offset)
                raw = f.read(4 * 1024 * 1024)
        except OSError:
            return
        data, used = convert_k8s_log(raw)
        if not used:
            return
        with w.file("log").open("ab") as out:
            out.write(data)
        write_text_atomic(w.file(f"{LOG_FILE}.offset"), str(offset + used))

    async def _record_end(self, w: Worker, name: str, state: str) -> None:
        rc, out, _ = await self._podman("inspect", "--type", "container", name)
        info = (json.loads(out or b"[]") or [{}])[0] if rc == 0 else {}
        st = info.get("State") or {}
        self.convert_log(w)
        code = st.get("ExitCode")
        fields: dict[str, Any] = {"ended_at": _now(), "container": name}
        if state == "created":  # never started
            fields.update(exit_code=None, error=st.get("Error") or "the container never started")
        else:
            fields["exit_code"] = code if isinstance(code, int) else None
        if w.file("stop_requested").exists():
            fields["stopped"] = True
        elif st.get("OOMKilled") or w.file(OOM_EVIDENCE).exists():
            # On these hybrid cgroups podman's inspect says OOMKilled: false; conmon's file
            # in its working directory (the worker's) is what shows the kernel's OOM kill.
            fields.update(reason=OOM, oom_killed=True)
        elif st.get("Error"):
            fields["error"] = str(st["Error"])
        # Ended, so its filesystem is free: kept output first, then the end (a crash between
        # the two releases it again, idempotently, before the end is written).
        await asyncio.to_thread(disk.release, w.dir)
        await self._end_share(w)
        write_json_atomic(w.file("exit.json"), fields)
        await self._podman("rm", "--force", name)

    # --- launching ----------------------------------------------------------------------

    async def _launch_pending(self) -> None:
        if not self._pending:
            return
        if not self._image_ok:
            if self._image_task is None:
                log.info("making sure image %s is here (built once per node)", self.config.image)
                self._image_task = asyncio.ensure_future(
                    ensure_image(self.config.image, self.env, self.config.podman)
                )
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
                await self.start_container(w)

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
        for b in ml_binds(w.dir):
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
        write_json_atomic(w.file(MARKER), {"name": c.name, "image": c.image})
        try:
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
        log.info("started container %s for worker %s", c.name, w.key)

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
            argv = run_argv(c, self.config.podman, env_file)[1:]
            return await self._podman(*argv, env=env, cwd=w.dir)
        finally:
            if env_file is not None:
                env_file.unlink(missing_ok=True)
