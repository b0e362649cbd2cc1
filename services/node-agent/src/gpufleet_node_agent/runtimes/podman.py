"""The podman runtime: each worker in its own container, through the podman CLI.

Most containers are started by runc, not `podman run` (runc.py: podman then only prepares
and mounts their image; `_poll_runc` watches them, no podman call). What follows is about
the containers `podman run` starts: where runc cannot, or with
GPUFLEET_CONTAINER_LAUNCHER=podman.

conmon, not the agent, is the container's parent, so a worker outlives an agent restart.
Beside the files of the supervisor protocol, a podman worker's directory has:

    container.json   {name, image}: written before `podman run`; a worker with it and no
                     container (and no exit.json) was lost
    conmon.pid       conmon's pid (`--conmon-pidfile`): watched to hear of the end
    container.log    conmon's log (k8s-file format), converted into `log`
    container.log.offset  bytes of container.log already converted

What its workers need before they run is its `steps` (worker/pipeline.py runs them): their
attached keys as files of the worker's uid, their quota disk, their GPU share, the read-only
directories of their binds, their image (pulled or built, a requirements.txt of the staged
model code among its packages: the base image made sure of once per node) and, without the
disk quota, the writable ones; once they have ended, what they left on their disk is kept
and the disk released.

Launching (`launch`, podman_start.py): several `podman run --detach` at once. Watching, per
round (`poll`): conmon's log is converted into `log` (no podman call); a stop request is
sent once (`podman stop`); and only when there is news (a conmon gone: the container has
ended) or at the periodic safety-net round (`full`), one `podman ps` of this node's
containers (by label) says how each ended (its exit code, no `inspect`) and which are gone
(reported lost); ended containers are removed together, one `podman rm` at the start of the
next round (awaited there, not left running beside it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import subprocess
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..baseimage import podman_env
from ..builds import Builder
from ..host.gpu_access import GpuAccess
from ..host.mps import Mps
from ..staging.registry import Fetchers, Uploaders
from ..steps import reservation
from ..steps.base import Step, WorkerFailed
from ..steps.disk import DiskStep, filled_at
from ..steps.image import ImageStep
from ..steps.inputs import InputsStep
from ..steps.keys import KeysStep
from ..steps.outputs import OutputsStep
from ..steps.serve import ServeStep
from ..steps.share import ShareStep
from ..worker import logcap
from ..worker.files import read_int, read_json, write_json_atomic, write_text_atomic
from ..worker.layout import ENV_FILE
from ..worker.progress import progress_for
from ..worker.workdir import Worker, proc_args
from . import procwatch
from .execfail import not_executed
from .podman_args import (
    LABEL,
    LOG_FILE,
    ContainerSpec,
    PodmanConfig,
    container_name,
    container_spec,
    convert_k8s_log,
    ml_binds,
    share_limits,
)
from .podman_start import CONMON_PID, MARKER, podman_run
from .runc import Runc, crun_problem, problem
from .supervise import EXIT_FILE

log = logging.getLogger("gpufleet.node_agent.podman")

OOM = "out of memory"
OOM_EVIDENCE = "oom"  # conmon writes it in its working directory on an OOM kill
ALIVE_STATES = frozenset({"running", "paused", "stopping", "removing", "initialized"})


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _nothing() -> None:
    """`notify` until a manager sets its own."""


def _input_dirs(w: Worker) -> list[Path]:
    """The sources of its read-only binds (/opt/ml/input, /opt/ml/models)."""
    return [b.host for b in ml_binds(w.dir) if b.read_only]


def _writable_dirs(w: Worker) -> list[Path]:
    """The sources of its writable binds (/opt/ml/checkpoint, /opt/ml/output), without the
    disk quota."""
    return [b.host for b in ml_binds(w.dir) if not b.read_only]


def _on_disk(w: Worker, target: str) -> Path:
    """With the disk quota a checkpoint is filled where its container sees it (disk.py)."""
    return filled_at(w.dir, target)


def _nowhere(w: Worker) -> list[Path]:
    """With the disk quota its writable places are on its own filesystem (disk.py), which
    keeps them in the worker's directory at the end only when they hold anything: nothing
    made here (issue 15: a directory made costs the node's disk a write)."""
    return []


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
        fetchers: Fetchers | None = None,
        uploaders: Uploaders | None = None,
        regional: Sequence[Step] = (),
    ) -> None:
        self.config = config
        self.minion_id = minion_id
        # the agent sets these from the inventory (prepare)
        self.gpu = gpu or GpuAccess.none()
        self.mps = mps  # fractional shares of real GPUs; None: no real GPUs
        self.node_gpus = 0
        self.node_cpus: int | None = None  # None: this machine's
        self.cpu_job_cpus = 0  # of those, offered to CPU-only jobs
        self.env = podman_env(config.containers_conf)
        self.notify: Callable[[], None] = _nothing
        self._ended: set[str] = set()  # conmon (or the runc supervisor) gone: how did it end?
        self._unwatched: set[str] = set()  # conmon cannot be watched: checked every round
        self._gone: set[str] = set()  # launched, and missing from two listings: lost
        # Missing from one listing: listed again next round before it is called lost (a
        # listing taken as its container starts or is removed can miss a live or ended one).
        self._missed: set[str] = set()
        self._stop_sent: set[str] = set()
        self._removed: set[str] = set()  # containers `podman rm` was asked to remove
        self._to_remove: list[str] = []  # ended ones, removed at the start of the next round
        self._tasks: set[asyncio.Task[Any]] = set()
        self._limit: asyncio.Semaphore | None = None  # `podman run`s at once
        self._listing: dict[str, dict[str, Any]] | None = None  # by name; None: unknown
        self._listed_at = 0.0
        self.builder = Builder(self._podman, config.podman, self.env, config.build)
        self.image_step = ImageStep(self._podman, self.builder, config, self.env)
        self.share_step = ShareStep(self)
        self.steps: tuple[Step, ...] = (
            KeysStep(config.uid),  # the worker's user reads its attached keys
            *regional,  # datastores mounted before the inputs; a reservation published
            DiskStep(config.uid, config.disk_quota),  # what the inputs' fetches count against
            self.share_step,
            InputsStep(
                _input_dirs,
                fetchers,
                progress_for=progress_for,
                where=_on_disk if config.disk_quota else None,
            ),
            self.image_step,  # the model code's requirements.txt is staged by now
            OutputsStep(
                _nowhere if config.disk_quota else _writable_dirs,
                uploaders,
                uid=config.uid,
                quota=True,  # an earlier agent's worker may have one, whatever the setting now
            ),
            ServeStep(config.uid),  # an endpoint's socket directory and server code; last, so
            # that its socket is the first thing gone at the end
        )
        # runc.py: new containers started by runc where it can; a restarted agent still
        # finds the runc containers of an earlier one whatever it is set to now
        crun_why = crun_problem() if config.launcher == "crun" else None
        crun = config.launcher == "crun" and crun_why is None
        if crun_why is not None:
            log.warning("containers started by runc, not crun: %s", crun_why)
        why_not = problem() if config.launcher != "podman" and not crun else None
        if why_not is not None:
            log.warning("containers started by podman, not runc: %s", why_not)
        self.runc = Runc(self._podman, config.uid, crun=crun)
        self.use_runc = config.launcher != "podman" and why_not is None
        self._runc_stop_sent: set[str] = set()
        self._runc_started: set[str] = set()  # placements whose marker was seen (_by_runc)

    def _by_runc(self, w: Worker) -> bool:
        """Was its container started by runc or crun (runc.py)? Its marker, remembered while
        it is active (asked for every worker several times a round)."""
        if w.placement_id in self._runc_started:
            return True
        if Runc.ours(w):
            self._runc_started.add(w.placement_id)
            return True
        return False

    # --- the port's quick half ----------------------------------------------------------

    def launched(self, w: Worker) -> bool:
        return w.file(MARKER).exists() or self._by_runc(w)

    def alive(self, w: Worker) -> bool:
        if self._by_runc(w):
            if self.runc.alive(w):
                return True
            if w.file(EXIT_FILE).exists():  # ended: the next round records how
                self._conmon_gone(w.placement_id)
                return True
            return False  # its supervisor is gone without a word: lost
        return w.placement_id not in self._gone

    def request_stop(self, w: Worker) -> None:
        """Nothing now: the next round stops a running container with `stop_requested`."""

    def reattach(self, w: Worker) -> bool:
        if Runc.ours(w):
            if self.runc.alive(w):
                if not self.runc.watch(w, self.ended(w)):
                    self._unwatched.add(w.placement_id)
                return True
            if w.file(EXIT_FILE).exists():  # ended while no agent watched
                self._conmon_gone(w.placement_id)
                return True
            return False
        if not w.file(MARKER).exists():  # never launched (the manager runs its steps)
            return False
        listing = self._list_sync()
        if listing is not None and self.container_of(w) not in listing:
            return False
        self.watch_conmon(w)
        return True

    def kill_orphan(self, w: Worker) -> None:
        if Runc.ours(w):
            self.runc.kill(w)
            self.runc.delete(w)
            self._runc_stop_sent.discard(w.placement_id)
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(
                [self.config.podman, "rm", "--force", self.container_of(w)],
                env=self.env,
                capture_output=True,
                timeout=60,
                check=False,
            )

    # --- launching ----------------------------------------------------------------------

    async def launch(self, w: Worker) -> None:
        """Its container, on the image its image step prepared: started by crun or runc on
        the image's node root (runc.py) where they can, else by `podman run`."""
        env_path = w.file(ENV_FILE)
        try:
            if not w.spec.command:
                raise WorkerFailed("its spec has no command")
            job_env = {str(k): str(v) for k, v in (read_json(env_path) or {}).items()}
            image = self.image_step.image(w)
            c = container_spec(
                w.spec,
                w.dir,
                self.minion_id,
                self.config,
                job_env=job_env,
                gpu=self.gpu,
                mps_pipe=self.share_step.pipe(w),
                limits=share_limits(
                    self.config,
                    self.node_gpus,
                    len(w.spec.gpu_indices),
                    node_cpus=self.node_cpus,
                    cpu_job_cpus=self.cpu_job_cpus,
                    cpu_count=w.spec.cpu_count or 0,
                ),
                image=image,
                reserved_port=reserved.port if (reserved := reservation.kept(w.dir)) else None,
            )
            if self.use_runc and Runc.unsuited(c) is None:
                await self._start_runc(w, c, check=image is not None)
            else:
                await self._start_podman(w, c)
        except WorkerFailed:
            raise
        except Exception as exc:  # podman gone, say: the worker fails, saying so
            raise WorkerFailed(f"cannot start its container: {exc}") from exc
        finally:
            env_path.unlink(missing_ok=True)  # the values now live only in the container

    async def _start_runc(self, w: Worker, c: ContainerSpec, check: bool) -> None:
        """Start it with runc on its image's node root (runc.py); `check`: its image was
        prepared for it (pulled, say), the root must be of the image the tag names now."""
        root = await self.runc.node_root(c.image, check)
        error = root if isinstance(root, str) else self.runc.launch(w, c, root, self.ended(w))
        if error is not None:
            raise WorkerFailed(error)
        log.info("started container %s for worker %s (runc)", c.name, w.key)

    async def _start_podman(self, w: Worker, c: ContainerSpec) -> None:
        write_json_atomic(w.file(MARKER), {"name": c.name, "image": c.image})
        if self._limit is None:
            self._limit = asyncio.Semaphore(max(1, self.config.parallel))
        async with self._limit:
            rc, _, err = await podman_run(self._podman, c, w, self.config.podman, self.env)
        if rc != 0:
            await self._podman("rm", "--force", c.name)
            why = err.decode(errors="replace").strip()[-500:]
            raise WorkerFailed(f"podman run failed ({rc}): {why}")
        write_json_atomic(
            w.file("started.json"), {"pid": None, "started_at": _now(), "container": c.name}
        )
        self.watch_conmon(w)
        log.info("started container %s for worker %s", c.name, w.key)

    def ended(self, w: Worker) -> Callable[[], None]:
        """What to call when `w`'s container has ended: the next round asks how."""
        return lambda: self._conmon_gone(w.placement_id)

    @staticmethod
    def container_of(w: Worker) -> str:
        return container_name(w.job_id, w.worker, w.placement_id)

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

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

    # --- the watch round --------------------------------------------------------------

    async def poll(self, workers: Sequence[Worker], full: bool = False) -> None:
        if self._to_remove:  # last round's ended containers, in one call
            batch, self._to_remove = self._to_remove, []
            await self._remove(batch)
        active = {w.placement_id for w in workers}
        self._runc_started &= active
        self.runc.keep_only(active)
        started_by_runc = [w for w in workers if self._by_runc(w)]
        await self._poll_runc(started_by_runc, full)
        workers = [w for w in workers if w.placement_id not in self._runc_started]
        for w in workers:
            if w.file(MARKER).exists():
                self.convert_log(w)
            self._stop_if_asked(w)
        ours = {w.placement_id for w in workers}
        news = (self._ended | self._unwatched | self._missed) & ours
        if not workers or not (full or news):
            return
        listing = await self._list()
        self._listing, self._listed_at = listing, time.monotonic()
        if listing is None:
            return
        ended: list[str] = []
        missed: set[str] = set()
        for w in workers:
            name = self.container_of(w)
            c = listing.get(name)
            if w.file("exit.json").exists():
                if c is not None:
                    ended.append(name)  # a crash left it, say
                continue
            if c is None:
                if not w.file(MARKER).exists():
                    continue
                if w.placement_id in self._missed:
                    self._gone.add(w.placement_id)  # the manager reports it lost
                missed.add(w.placement_id)
                continue
            if str(c.get("State") or "").lower() in ALIVE_STATES:
                continue
            await self._record_end(w, c)
            ended.append(name)
        names = {self.container_of(w) for w in workers}
        for name, c in listing.items():  # an old, ended one of this node's
            if name not in names and str(c.get("State") or "").lower() not in ALIVE_STATES:
                ended.append(name)
        # What this round has dealt with; news that came during the listing stays.
        self._ended -= news
        self._unwatched &= {w.placement_id for w in workers if not w.file("exit.json").exists()}
        self._gone &= ours
        self._missed = missed
        self._stop_sent &= ours
        self._removed &= set(listing)  # the ones gone from the listing are removed
        fresh = [n for n in ended if n not in self._removed]
        self._removed.update(fresh)
        self._to_remove.extend(fresh)

    async def _poll_runc(self, workers: Sequence[Worker], full: bool) -> None:
        """The containers runc started (runc.py): no podman call, their supervisors' files
        (each looked at once a round: this runs many times a second)."""
        done: set[str] = set()  # ended and recorded
        for w in workers:
            p = w.placement_id
            if w.file("exit.json").exists():
                done.add(p)
                continue
            self.runc.forget_config(w)
            if p not in self._runc_stop_sent and w.file("stop_requested").exists():
                self._runc_stop_sent.add(p)
                self.runc.stop(w, self.config.stop_grace_s)
            if (p in self._ended or p in self._unwatched or full) and not self.runc.alive(w):
                await self._record_runc_end(w)
                if w.file("exit.json").exists():
                    done.add(p)
        self._ended -= done
        self._runc_stop_sent &= {w.placement_id for w in workers} - done

    async def _record_runc_end(self, w: Worker) -> None:
        fields = await asyncio.to_thread(self.runc.end_fields, w)
        if fields is None:
            return  # no `exit`: alive() says so and the manager reports it lost
        if w.file("stop_requested").exists():
            fields["stopped"] = True
        write_json_atomic(w.file("exit.json"), fields)
        w.file(EXIT_FILE).unlink(missing_ok=True)

    def _stop_if_asked(self, w: Worker) -> None:
        p = w.placement_id
        if p in self._stop_sent or not w.file("stop_requested").exists():
            return
        if not w.file(MARKER).exists() or w.file("exit.json").exists():
            return
        self._stop_sent.add(p)
        self._spawn(self._stop(self.container_of(w)))

    async def _remove(self, names: list[str]) -> None:
        """One `podman rm` for all of a round's ended containers."""
        rc, _, err = await self._podman("rm", "--force", "--ignore", *names)
        if rc != 0:
            log.warning("podman rm failed (%d): %s", rc, err.decode(errors="replace").strip())
            self._removed.difference_update(names)  # tried again by a later round

    async def _stop(self, name: str) -> None:
        await self._podman("stop", "--time", str(self.config.stop_grace_s), name)

    def convert_log(self, w: Worker) -> None:
        """Append what conmon logged since the last call to `log` (shipped by reports.py);
        what was converted is freed from conmon's file, a backlog too large to convert in
        time is skipped with a notice (logcap.py)."""
        path = w.file(LOG_FILE)
        offset = read_int(w.file(f"{LOG_FILE}.offset")) or 0
        try:
            size = path.stat().st_size
            if size - offset > logcap.BACKLOG_MAX:  # resume after the last whole record
                with path.open("rb") as f:
                    f.seek(size - 65536)
                    last = f.read(65536).rfind(b"\n")
                resume = size - 65536 + last + 1 if last >= 0 else size
                with w.file("log").open("ab") as out:
                    out.write(f"\n[gpufleet: {resume - offset} bytes of output skipped]\n".encode())
                write_text_atomic(w.file(f"{LOG_FILE}.offset"), str(resume))
                logcap.freed(path, resume)
                return
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
        logcap.freed(path, offset + used)

    async def _record_end(self, w: Worker, c: Mapping[str, Any]) -> None:
        """How it ended, from its listing (`podman ps`: state and exit code)."""
        self.convert_log(w)
        name = self.container_of(w)
        code = c.get("ExitCode")
        fields: dict[str, Any] = {"ended_at": _now(), "container": name}
        if str(c.get("State") or "").lower() == "created":  # never started
            fields.update(exit_code=None, error="the container never started")
        else:
            fields["exit_code"] = code if isinstance(code, int) else None
            if code == 1:  # catatonit's, when the command is not there
                fields.update(not_executed(w))
        if w.file("stop_requested").exists():
            fields["stopped"] = True
        elif w.file(OOM_EVIDENCE).exists():
            # On these hybrid cgroups podman says OOMKilled: false; conmon's file in its
            # working directory (the worker's) is what shows the kernel's OOM kill.
            fields.update(reason=OOM, oom_killed=True)
        write_json_atomic(w.file("exit.json"), fields)
