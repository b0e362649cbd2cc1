"""The workers of this node: start, stop, watch and report them, with all state in files.

One directory per placement, `<state_dir>/workers/<placement_id>/`. A StartWorker's
secrets come sealed to this node's key and are opened in memory (sealing.py); the values go
to the 0600 files below, for this worker's runtime and steps alone. Besides the files the
runtime writes (see `supervise`) and those of its steps (`disk.img`, `secrets/`, ...), the
agent keeps:

    spec.json           the worker's spec (spec.py: StartWorker less its secrets), written
                        before the directory appears
    env.json            the job's env values (secrets, R-JOB-7), 0600; the runtime reads it
                        and deletes it as it launches the worker
    registry.json       the credential its image is pulled with (R-JOB-7), 0600; for a
                        runtime that pulls images, which deletes it after the pull (images.py)
    keys.json           its attached keys (R-JOB-7), 0600, until its keys step writes them
                        out as files under secrets/ (steps/keys.py)
    steps               its steps' done-markers (pipeline.py)
    stop_requested      the reason of a StopWorker, when one came
    log.offset          bytes of `log` already published
    log.pending         end of the log chunk being published (re-sent as is after a crash)
    reported_started    WorkerStarted was acknowledged by JetStream
    upload/             the output's archive while it is put (steps/outputs.py)
    uploaded            the output was put where the job says
    upload_failed       why it could not be: the worker is reported failed (the archive
                        kept under <state_dir>/kept-outputs/<placement>/)
    reported_finished   WorkerFinished was acknowledged; the placement is done
    serve/, endpoint/   an endpoint's socket directory and server code (steps/serve.py)
    notebook.json       a notebook's token's SHA-256 (never the token), 0600, written with the
                        directory: what the proxy opens it with (steps/serve.py)
    endpoint.json       what the proxy published of an endpoint's worker (proxy/served.py)

A worker goes through its runtime's steps and is launched (pipeline.py), is watched by the
rounds of `run` until it has ended, has its steps torn down, and is reported. Because the
directory exists from the first StartWorker on, a redelivered StartWorker never starts a
worker twice; because the reported_* flags are written only after JetStream's ack, an event
lost in a crash is sent again (with the same message id, so JetStream drops a copy it
already has).

Beside it: workdir.py (a placement's directory name, whether its supervisor or command is
alive) and reports.py (the WorkerStarted, log chunks and WorkerFinished it publishes).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from gpufleet_auth.sealing import SealingKey
from gpufleet_bus import tracing
from gpufleet_bus.publish import Publisher, publish
from gpufleet_contracts.clock import utcnow
from gpufleet_contracts.jobs import StartWorker
from gpufleet_contracts.serving import NOTEBOOK_TOKEN_ENV

from .. import sealing
from ..images import REGISTRY_FILE
from ..runtimes.policy import RuntimePolicy
from ..runtimes.port import WorkerRuntime
from ..runtimes.process import ProcessRuntime
from ..sealing import NodeKey
from ..steps import serve
from ..steps.keys import KEYS_FILE
from . import spec as specs
from .files import read_json, write_json_atomic, write_secret_json, write_text_atomic
from .layout import ENV_FILE
from .pipeline import Pipeline
from .reports import Reports
from .spec import SPEC_FILE, WorkerSpec
from .workdir import Worker, dir_name

log = logging.getLogger("gpufleet.node_agent.workers")

SOURCE = "gpufleet/node-agent"
LOST_AT_RESTART = ProcessRuntime.lost_at_restart
LOST_AT_RUNTIME = ProcessRuntime.lost_at_runtime
STOPPED_BEFORE_START = "stopped before it started"
LOG_MAX_BYTES = 64 * 1024 * 1024  # a worker's output kept and shipped, at most (logcap.py)
TEARDOWN_WAIT_S = 0.25  # the round that sees an end waits this long for its teardown


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
        # How workers run (runtimes/port.py): `runtime` unless `policy` (policy.py) chooses
        # one of `others` for a worker; bare supervised processes unless told otherwise. A
        # worker's runtime is kept in its spec, so a restart finds it with the same one.
        self.runtime: WorkerRuntime = runtime or ProcessRuntime()
        self.runtimes: dict[str, WorkerRuntime] = {r.name: r for r in others}
        self.runtimes[self.runtime.name] = self.runtime
        for rt in self.runtimes.values():
            rt.notify = self.wake  # a worker's end (or start) is reported at once
        self.policy = policy
        self.sealing_key = sealing_key  # opens StartWorker's sealed secrets (sealing.py)
        self._active: dict[str, Worker] = {}
        self._news = asyncio.Event()
        self.pipeline = Pipeline(clock, self.wake)  # each worker's steps, then its launch

    # --- queries --------------------------------------------------------------------

    def worker_dir(self, placement_id: str) -> Path:
        return self.root / dir_name(placement_id)

    @property
    def active(self) -> dict[str, Worker]:
        """Placements not yet reported finished, by placement id."""
        return dict(self._active)

    def running(self) -> list[str]:
        """`<job_id>/<worker>` of the workers being set up or handed to their runtime that
        have not ended."""
        return sorted(
            w.key
            for w in self._active.values()
            if (w.setting_up or self.rt(w).launched(w)) and not w.file("exit.json").exists()
        )

    def rt(self, w: Worker) -> WorkerRuntime:
        """The runtime of `w`."""
        return self.runtimes.get(w.runtime) or self.runtime

    # --- commands -------------------------------------------------------------------

    def _create(self, spec: WorkerSpec, files: Mapping[str, dict[str, Any]]) -> Path | None:
        """Create the placement's directory with its spec.json and `files` in one rename;
        None if it exists."""
        final = self.worker_dir(spec.placement_id)
        if final.exists():
            return None
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        # Plain writes: the directory appears whole, with them, in the rename below.
        (tmp / SPEC_FILE).write_text(spec.model_dump_json())
        for name, data in files.items():
            if name in (ENV_FILE, REGISTRY_FILE, KEYS_FILE, serve.TOKEN_FILE):
                write_secret_json(tmp / name, data)
            else:
                (tmp / name).write_text(json.dumps(data))
        try:
            os.rename(tmp, final)
        except OSError:  # appeared meanwhile
            shutil.rmtree(tmp, ignore_errors=True)
            return None
        return final

    def start(self, cmd: StartWorker) -> bool:
        """Start the worker of `cmd` unless this placement was seen before: its steps, then
        its launch (pipeline.py). True when it went on its way (its end, whatever it is, is
        reported); False when it was refused or is known already."""
        unopened: str | None = None
        try:  # its secrets, in memory: into its 0600 files below, nowhere else
            cmd = sealing.opened(cmd, self.sealing_key)
        except sealing.Unopened as exc:
            unopened = exc.reason
        decision = None if self.policy is None else self.policy.choose(cmd)
        runtime = self.runtime.name if decision is None else decision.runtime
        spec = WorkerSpec.of(cmd, runtime or "", self.clock(), tracing.current())
        # The values are secrets: in 0600 files until the runtime or a step has read them.
        files: dict[str, dict[str, Any]] = {}
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
            files[KEYS_FILE] = cmd.attached_keys
        if refused is None and serve.is_notebook(cmd.serving):
            kept = serve.kept_token(cmd.env)
            if kept is None:
                refused = f"a notebook needs its token ({NOTEBOOK_TOKEN_ENV})"
            else:
                files[serve.TOKEN_FILE] = kept
        if refused is not None:
            files["exit.json"] = {
                "exit_code": None,
                "ended_at": self.clock().isoformat(),
                "error": refused,
            }
        d = self._create(spec, files)
        if d is None:
            log.info("placement %s is known already; StartWorker ignored", cmd.placement_id)
            return False
        w = Worker(spec, d)
        self._active[cmd.placement_id] = w
        self.wake()
        if refused is not None:
            log.warning("refused %s: %s", w.key, refused)
            return False
        self.pipeline.start(w, self.rt(w))
        return True

    def stop(self, job_id: str, worker: int, placement_id: str, reason: str = "stopped") -> None:
        """Stop a worker: its supervisor terminates the command and records `stopped` (or,
        not launched yet, its steps stop and it is recorded `stopped`)."""
        d = self.worker_dir(placement_id)
        if not d.exists():
            # Never seen (or the StopWorker overtook its StartWorker): a tombstone, so the
            # scheduler frees the GPUs and a late StartWorker finds the placement taken.
            now = self.clock()
            spec = WorkerSpec(
                placement_id=placement_id, job_id=job_id, worker=worker, received_at=now
            )
            stopped = {
                "exit_code": None,
                "ended_at": now.isoformat(),
                "stopped": True,
                "reason": STOPPED_BEFORE_START,
            }
            created = self._create(spec, {"exit.json": stopped})
            if created is not None:
                self._active[placement_id] = Worker(spec, created)
                self.wake()
            return
        w = self._active.get(placement_id)
        if w is None or w.file("exit.json").exists():
            return  # already over
        if not w.file("stop_requested").exists():
            write_text_atomic(w.file("stop_requested"), reason)
        log.info("stopping worker %s: %s", w.key, reason)
        w.stop_asked = True
        if not w.setting_up:  # else its steps stop before its launch (pipeline.py)
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
        """Pick up, after a restart, every placement not yet reported finished: a launched
        worker is re-attached to its runtime, one not launched yet goes on through the steps
        its done-markers do not name (both counted re-attached)."""
        found = Recovery()
        if not self.root.exists():
            return found
        for d in sorted(self.root.iterdir()):
            if d.name.startswith(".tmp-"):
                shutil.rmtree(d, ignore_errors=True)  # a start() cut short: never ran
                continue
            if not d.is_dir() or (d / "reported_finished").exists():
                continue
            spec = specs.read(d)
            if spec is None:
                log.error("worker directory %s has no readable spec.json; skipped", d)
                continue
            if spec.placement_id in self._active:
                continue
            w = Worker(spec, d)
            self._active[spec.placement_id] = w
            rt = self.rt(w)
            if w.file("exit.json").exists():
                found.finished.append(spec.placement_id)
            elif not rt.launched(w):
                w.stop_asked = w.file("stop_requested").exists()
                self.pipeline.start(w, rt, resumed=True)
                found.reattached.append(spec.placement_id)
            elif rt.reattach(w):
                found.reattached.append(spec.placement_id)
            elif not w.file("exit.json").exists():  # it may have ended just now
                self._mark_gone(w, rt.lost_at_restart)
                found.lost.append(spec.placement_id)
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
        launched = [w for w in workers if not w.setting_up]  # the runtimes' (port.py)
        for rt in self.runtimes.values():
            try:
                await rt.poll([w for w in launched if self.rt(w) is rt], full)
            except Exception as exc:  # podman failing, say: the files say what is known
                log.warning("worker runtime %s: %s", rt.name, exc)
        # Every worker's reports at once (no await per message): a round costs about one
        # round trip to JetStream however many workers it reports on (reports.py).
        results = await asyncio.gather(
            *(self._watch_traced(w) for w in workers), return_exceptions=True
        )
        for w, res in zip(workers, results, strict=True):
            if isinstance(res, Exception):  # NATS down, say: try again next round
                log.warning("worker %s: will retry reporting: %s", w.key, res)

    async def _staging(self, w: Worker) -> None:
        """Its staging reported (reports.py); a failure only logged: the next change goes."""
        try:
            await self.report_staging(w, time.monotonic())
        except Exception as exc:
            log.debug("worker %s: staging not reported: %s", w.key, exc)

    async def _watch_traced(self, w: Worker) -> None:
        """`_watch`, its reports continuing the worker's job's trace (gpufleet_bus.tracing)."""
        with tracing.continuing(w.spec.trace):
            await self._watch(w)

    async def _watch(self, w: Worker) -> None:
        if w.setting_up:  # its steps' progress (a build's, its fetches') is on its log
            await asyncio.gather(self.ship_log(w), self._staging(w))
            return
        ended = w.file("exit.json").exists()
        rt = self.rt(w)
        if not ended and not rt.alive(w) and not w.file("exit.json").exists():
            self._mark_gone(w, rt.lost_at_runtime)
            ended = True
        if ended and not w.torn_down:
            # Its steps undone, last first, in this one place, before its end is reported:
            # in a task of its own (an upload may take hours). A quick teardown is over
            # within the round that saw the end; a long one goes on alone, never holding
            # another worker's reports more than this once.
            first = w.tearing is None
            tearing = self.pipeline.tear_down(w, rt)
            if first:
                await asyncio.wait({tearing}, timeout=TEARDOWN_WAIT_S)
        if w.started is None:  # written once, at launch
            w.started = read_json(w.file("started.json"))
        started = w.started
        if not w.reported_started and w.file("reported_started").exists():
            w.reported_started = True
        pending: list[Awaitable[object]] = []
        if started is not None and not w.reported_started:
            pending.append(self._report_started(w, started))
        if w.uploading_at is not None and not w.reported_uploading and w.reported_started:
            pending.append(self._report_uploading(w))
        if w.staging:
            pending.append(self._staging(w))
        pending.append(self.ship_log(w))
        done = await asyncio.gather(*pending)
        uploading_told = w.uploading_at is None or w.reported_uploading or started is None
        if ended and w.torn_down and uploading_told and done[-1] is True:
            exit_data = read_json(w.file("exit.json")) or {}
            evt = self.finished_event(w, exit_data, started)
            # its run, a step of the job's trace when that is sampled (none otherwise)
            tracing.mark(
                w.spec.trace,
                "run worker",
                {"gpufleet.job.id": w.job_id, "gpufleet.worker": w.spec.worker},
                start=w.spec.received_at,
            )
            await publish(self.broker, evt, source=self.source, msg_id=f"finished:{w.placement_id}")
            w.file("reported_finished").touch()
            self._active.pop(w.placement_id, None)
            log.info(
                "worker %s %s%s", w.key, evt.state.value, f": {evt.reason}" if evt.reason else ""
            )
