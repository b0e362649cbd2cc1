"""The workers of this node: start, stop, watch and report them, with all state in files.

One directory per placement, `<state_dir>/workers/<placement_id>/`. A StartWorker's
secrets come sealed to this node's key and are opened in memory (sealing.py); the values go
to the 0600 files below, for this worker's supervisor, runtime and keys alone. Besides the
files the supervisor writes (see `supervise`), the agent keeps:

    spec.json           the StartWorker command, less its env values (written before the
                        directory appears)
    env.json            the job's env values (secrets, R-JOB-7), 0600; the supervisor reads
                        it and deletes it before the command starts (`supervise`)
    registry.json       the credential its image is pulled with (R-JOB-7), 0600; for a
                        runtime that pulls images, which deletes it after the pull (images.py)
    keys.json           its attached keys (R-JOB-7), 0600, until written out as files
                        under secrets/ (keyfiles.py), removed when the worker has ended
    stop_requested      the reason of a StopWorker, when one came
    log.offset          bytes of `log` already published
    log.pending         end of the log chunk being published (re-sent as is after a crash)
    reported_started    WorkerStarted was acknowledged by JetStream
    reported_finished   WorkerFinished was acknowledged; the placement is done

Because the directory exists from the first StartWorker on, a redelivered StartWorker never
starts a worker twice; because the reported_* flags are written only after JetStream's ack,
an event lost in a crash is sent again (with the same message id, so JetStream drops a copy
it already has).

Beside it: workdir.py (a placement's directory name, whether its supervisor or command is
alive) and reports.py (the WorkerStarted, log chunks and WorkerFinished it publishes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import time
import uuid
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from gpufleet_auth.sealing import SealingKey
from gpufleet_bus.publish import Publisher, publish
from gpufleet_contracts.clock import utcnow
from gpufleet_contracts.jobs import StartWorker

from . import keyfiles, sealing
from .files import read_json, write_json_atomic, write_secret_json, write_text_atomic
from .images import REGISTRY_FILE
from .policy import PROCESS, RuntimePolicy
from .reports import Reports
from .runtime import ProcessRuntime, WorkerRuntime
from .sealing import NodeKey
from .workdir import Worker, dir_name

log = logging.getLogger("gpufleet.node_agent.workers")

SOURCE = "gpufleet/node-agent"
LOST_AT_RESTART = ProcessRuntime.lost_at_restart
LOST_AT_RUNTIME = ProcessRuntime.lost_at_runtime
ENV_FILE = "env.json"  # the job's env values: 0600, deleted by the supervisor once read
SECRET_FILES = frozenset({ENV_FILE, REGISTRY_FILE, keyfiles.KEYS_FILE})
STOPPED_BEFORE_START = "stopped before it started"
LOG_MAX_BYTES = 64 * 1024 * 1024  # a worker's output kept and shipped, at most (logcap.py)


@dataclass
class Recovery:
    """What `recover()` found, by placement id."""

    finished: list[str] = field(default_factory=list)
    reattached: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)


class WorkerManager(Reports):
    def __init__(
        self,
        state_dir: Path,
        minion_id: str,
        broker: Publisher,
        *,
        log_chunk_bytes: int = 16384,
        log_max_bytes: int = LOG_MAX_BYTES,
        gpu_indices: Collection[int] | None = None,
        clock: Callable[[], datetime] = utcnow,
        source: str = SOURCE,
        runtime: WorkerRuntime | None = None,
        others: Iterable[WorkerRuntime] = (),
        policy: RuntimePolicy | None = None,
        sealing_key: SealingKey | NodeKey | None = None,
    ) -> None:
        self.root = state_dir / "workers"
        self.minion_id = minion_id
        self.broker = broker
        self.log_chunk_bytes = log_chunk_bytes
        self.log_max_bytes = log_max_bytes
        self.gpu_indices = None if gpu_indices is None else set(gpu_indices)
        self.clock = clock
        self.source = source
        # How workers run (runtime.py): `runtime` unless `policy` (policy.py) chooses one of
        # `others` for a worker; bare supervised processes unless told otherwise. A worker's
        # runtime is kept in its spec.json, so a restart finds it with the same one.
        self.runtime: WorkerRuntime = runtime or ProcessRuntime()
        self.runtimes: dict[str, WorkerRuntime] = {r.name: r for r in others}
        self.runtimes[self.runtime.name] = self.runtime
        for rt in self.runtimes.values():
            rt.notify = self.wake  # a worker's end (or start) is reported at once
        self.policy = policy
        self.sealing_key = sealing_key  # opens StartWorker's sealed secrets (sealing.py)
        self._active: dict[str, Worker] = {}
        self._news = asyncio.Event()

    # --- queries --------------------------------------------------------------------

    def worker_dir(self, placement_id: str) -> Path:
        return self.root / dir_name(placement_id)

    @property
    def active(self) -> dict[str, Worker]:
        """Placements not yet reported finished, by placement id."""
        return dict(self._active)

    def running(self) -> list[str]:
        """`<job_id>/<worker>` of the workers handed to the runtime that have not ended."""
        return sorted(
            w.key
            for w in self._active.values()
            if self.rt(w).launched(w) and not w.file("exit.json").exists()
        )

    def rt(self, w: Worker) -> WorkerRuntime:
        """The runtime of `w`."""
        return self.runtimes.get(w.runtime) or self.runtime

    @staticmethod
    def runtime_named(spec: dict[str, Any], d: Path) -> str:
        """The runtime a worker directory's spec names; before it did: podman's marker, or
        else a bare process (the only runtime there was)."""
        name = spec.get("runtime")
        if isinstance(name, str) and name:
            return name
        return "podman" if (d / "container.json").exists() else PROCESS

    # --- commands -------------------------------------------------------------------

    def _create(self, placement_id: str, files: dict[str, dict[str, Any]]) -> Path | None:
        """Create the placement's directory with `files` in one rename; None if it exists."""
        final = self.worker_dir(placement_id)
        if final.exists():
            return None
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        for name, data in files.items():
            if name in SECRET_FILES:
                write_secret_json(tmp / name, data)
            else:
                write_json_atomic(tmp / name, data)
        try:
            os.rename(tmp, final)
        except OSError:  # appeared meanwhile
            shutil.rmtree(tmp, ignore_errors=True)
            return None
        return final

    def start(self, cmd: StartWorker) -> bool:
        """Start the worker of `cmd` unless this placement was seen before. True if started."""
        unopened: str | None = None
        try:  # its secrets, in memory: into its 0600 files below, nowhere else
            cmd = sealing.opened(cmd, self.sealing_key)
        except sealing.Unopened as exc:
            unopened = exc.reason
        decision = None if self.policy is None else self.policy.choose(cmd)
        runtime = self.runtime.name if decision is None else decision.runtime
        spec = {
            "placement_id": cmd.placement_id,
            "job_id": cmd.job_id,
            "job_name": cmd.job_name,
            "worker": cmd.worker,
            "command": cmd.command,
            # The values are secrets: in env.json (0600) until the supervisor has read them.
            "env_names": sorted(cmd.env),
            "gpu_indices": cmd.gpu_indices,
            "gpu_uuids": cmd.gpu_uuids,
            "received_at": self.clock().isoformat(),
            # The mount plan and GPU share (R-JOB-3/4, R-SCHED-4), set up by the supervisor.
            "mounts": [m.model_dump(mode="json") for m in cmd.mounts],
            "output_archive": cmd.output_archive,
            "output_upload": cmd.output_upload,
            "gpu_fraction": None if cmd.gpu_fraction is None else str(cmd.gpu_fraction),
            "gpu_memory_limit_mb": cmd.gpu_memory_limit_mb,
            "cpu_count": cmd.cpu_count,  # a CPU-only worker's reserved CPUs (R-JOB-2)
            # R-JOB-7: the job's own image (its credential apart), and the disk it must fit
            "image": cmd.image,
            "disk_size_gb": cmd.disk_size_gb,
            # R-JOB-7: the base environment and packages, made ready before it runs (prepare.py)
            "base_environment": (
                None
                if cmd.base_environment is None
                else cmd.base_environment.model_dump(mode="json")
            ),
            "packages": cmd.packages.model_dump(mode="json"),
            "owner": cmd.owner,
            "creator": cmd.creator,
            "runtime": runtime or "",
            # R-JOB-7: the types of its attached keys; the values in keys.json (0600)
            "key_types": sorted(cmd.attached_keys),
        }
        files: dict[str, dict[str, Any]] = {"spec.json": spec}
        if cmd.env:
            files[ENV_FILE] = dict(cmd.env)
        if cmd.registry_auth is not None and cmd.image and self.runtime.pulls_images:
            files[REGISTRY_FILE] = cmd.registry_auth.model_dump()
        unknown = sorted(set(cmd.gpu_indices) - (self.gpu_indices or set()))
        refused = None if decision is None else decision.refused
        if self.gpu_indices is not None and unknown:
            refused = f"GPU index {unknown} is not on this node (it has {sorted(self.gpu_indices)})"
        refused = unopened or refused
        if refused is None and cmd.attached_keys:
            files[keyfiles.KEYS_FILE] = cmd.attached_keys
        if refused is not None:
            files["exit.json"] = {
                "exit_code": None,
                "ended_at": self.clock().isoformat(),
                "error": refused,
            }
        d = self._create(cmd.placement_id, files)
        if d is None:
            log.info("placement %s is known already; StartWorker ignored", cmd.placement_id)
            return False
        w = Worker(cmd.placement_id, d, cmd.job_id, cmd.worker, runtime or "")
        self._active[cmd.placement_id] = w
        if "exit.json" in files:
            log.warning("refused %s: %s", w.key, files["exit.json"]["error"])
            self.wake()
            return False
        self.wake()
        # the keys become the worker's files first (for its uid), then it runs
        error = keyfiles.materialize(d, self.rt(w).secrets_uid) or self.rt(w).launch(w)
        if error is not None:
            write_json_atomic(
                w.file("exit.json"),
                {"exit_code": None, "ended_at": self.clock().isoformat(), "error": error},
            )
            return False
        log.info(
            "started worker %s (placement %s, GPUs %s, runtime %s)",
            w.key,
            w.placement_id,
            cmd.gpu_indices,
            self.rt(w).name,
        )
        return True

    def stop(self, job_id: str, worker: int, placement_id: str, reason: str = "stopped") -> None:
        """Stop a worker: its supervisor terminates the command and records `stopped`."""
        d = self.worker_dir(placement_id)
        if not d.exists():
            # Never seen (or the StopWorker overtook its StartWorker): a tombstone, so the
            # scheduler frees the GPUs and a late StartWorker finds the placement taken.
            now = self.clock().isoformat()
            created = self._create(
                placement_id,
                {
                    "spec.json": {
                        "placement_id": placement_id,
                        "job_id": job_id,
                        "worker": worker,
                        "command": None,
                        "received_at": now,
                    },
                    "exit.json": {
                        "exit_code": None,
                        "ended_at": now,
                        "stopped": True,
                        "reason": STOPPED_BEFORE_START,
                    },
                },
            )
            if created is not None:
                self._active[placement_id] = Worker(placement_id, created, job_id, worker)
                self.wake()
            return
        w = self._active.get(placement_id)
        if w is None or w.file("exit.json").exists():
            return  # already over
        if not w.file("stop_requested").exists():
            write_text_atomic(w.file("stop_requested"), reason)
        log.info("stopping worker %s: %s", w.key, reason)
        self.rt(w).request_stop(w)
        self.wake()

    async def stop_all(self, reason: str, timeout_s: float) -> list[str]:
        """Stop every active worker and wait, while the watch loop (`run`) reports them,
        until none is left or `timeout_s` has passed; the keys of those still active."""
        asked: set[str] = set()
        deadline = time.monotonic() + timeout_s
        while self._active and time.monotonic() < deadline:
            for w in list(self._active.values()):  # one placed meanwhile too
                if w.placement_id not in asked:
                    asked.add(w.placement_id)
                    self.stop(w.job_id, w.worker, w.placement_id, reason)
            await asyncio.sleep(0.1)
        return sorted(w.key for w in self._active.values())

    # --- restart --------------------------------------------------------------------

    def recover(self) -> Recovery:
        """Pick up, after a restart, every placement not yet reported finished."""
        found = Recovery()
        if not self.root.exists():
            return found
        for d in sorted(self.root.iterdir()):
            if d.name.startswith(".tmp-"):
                shutil.rmtree(d, ignore_errors=True)  # a start() cut short: never ran
                continue
            if not d.is_dir() or (d / "reported_finished").exists():
                continue
            spec = read_json(d / "spec.json")
            if spec is None:
                log.error("worker directory %s has no readable spec.json; skipped", d)
                continue
            placement_id = str(spec["placement_id"])
            if placement_id in self._active:
                continue
            runtime = self.runtime_named(spec, d)
            w = Worker(placement_id, d, str(spec["job_id"]), int(spec["worker"]), runtime)
            self._active[placement_id] = w
            if w.file("exit.json").exists():
                found.finished.append(placement_id)
            # a start cut short between its directory and its keys' files: written now
            elif not keyfiles.materialize(d, self.rt(w).secrets_uid) and self.rt(w).reattach(w):
                found.reattached.append(placement_id)
            elif not w.file("exit.json").exists():  # it may have ended just now
                self._mark_gone(w, self.rt(w).lost_at_restart)
                found.lost.append(placement_id)
        return found

    def _mark_gone(self, w: Worker, reason: str) -> None:
        """The runtime lost the worker without exit.json: record the end ourselves."""
        self.rt(w).kill_orphan(w)
        now = self.clock().isoformat()
        if w.file("stop_requested").exists():
            data: dict[str, Any] = {"exit_code": None, "ended_at": now, "stopped": True}
        else:
            data = {"exit_code": None, "ended_at": now, "lost": True, "reason": reason}
            log.warning("worker %s (placement %s): %s", w.key, w.placement_id, reason)
        write_json_atomic(w.file("exit.json"), data)

    # --- watching -------------------------------------------------------------------

    def wake(self) -> None:
        """Something happened (a start, a stop, a runtime's news of an end): a round now."""
        self._news.set()

    async def run(self, interval: float = 0.5, check_s: float = 5.0) -> None:
        """Watch the workers until cancelled. A round runs when there is news (`wake`:
        workers' ends come as events, procwatch.py), every `interval` while workers are
        active (their new log is shipped), and at least every `check_s` as a safety net
        (`full`: the runtimes check on every worker, e.g. podman lists its containers).
        Idle, the loop sleeps until news or the safety net."""
        last_full = time.monotonic()
        while True:
            timeout = interval if self._active else check_s
            # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancellation that
            # comes as the news does, and the agent's stop then waits on this loop forever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._news.wait()
            self._news.clear()
            full = time.monotonic() - last_full >= check_s
            if full:
                last_full = time.monotonic()
            await self.poll_once(full=full)

    async def poll_once(self, full: bool = True) -> None:
        workers = list(self._active.values())
        for rt in self.runtimes.values():
            try:
                await rt.poll([w for w in workers if self.rt(w) is rt], full)
            except Exception as exc:  # podman failing, say: the files say what is known
                log.warning("worker runtime %s: %s", rt.name, exc)
        # Every worker's reports at once (no await per message): a round costs about one
        # round trip to JetStream however many workers it reports on (reports.py).
        results = await asyncio.gather(*(self._watch(w) for w in workers), return_exceptions=True)
        for w, res in zip(workers, results, strict=True):
            if isinstance(res, Exception):  # NATS down, say: try again next round
                log.warning("worker %s: will retry reporting: %s", w.key, res)

    async def _watch(self, w: Worker) -> None:
        ended = w.file("exit.json").exists()
        rt = self.rt(w)
        if not ended and not rt.alive(w) and not w.file("exit.json").exists():
            self._mark_gone(w, rt.lost_at_runtime)
            ended = True
        if w.started is None:  # written once, at launch
            w.started = read_json(w.file("started.json"))
        started = w.started
        if not w.reported_started and w.file("reported_started").exists():
            w.reported_started = True
        pending: list[Awaitable[object]] = []
        if started is not None and not w.reported_started:
            pending.append(self._report_started(w, started))
        pending.append(self.ship_log(w))
        done = await asyncio.gather(*pending)
        if ended:
            keyfiles.remove(w.dir)  # its keys leave the node with it
        if ended and done[-1] is True:
            exit_data = read_json(w.file("exit.json")) or {}
            evt = self.finished_event(w, exit_data, started)
            await publish(self.broker, evt, source=self.source, msg_id=f"finished:{w.placement_id}")
            w.file("reported_finished").touch()
            self._active.pop(w.placement_id, None)
            log.info(
                "worker %s %s%s", w.key, evt.state.value, f": {evt.reason}" if evt.reason else ""
            )
