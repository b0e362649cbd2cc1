"""The worker runtime port: how a placement's worker is run, watched, stopped and found
again after a restart. WorkerManager (workers.py) keeps the state in the worker's directory
and reports; a runtime only runs the worker and writes the files of the supervisor protocol
(`supervise.py`): `started.json` when it runs, `log`, and `exit.json` when it has ended.

Two implementations, chosen per worker by the runtime policy (policy.py):

- `podman` (default): each worker in its own OCI container; podman pulls, builds and
  mounts the images, and runc starts the containers under the worker's shell supervisor
  (`runc.py`) or, where runc cannot, `podman run` does (`podman.py`).
- `process` (the operator's opt-in for the node owner's own jobs): a bare host process under
  a tiny shell supervisor (`ProcessRuntime`, below; `supervise.py`).

A runtime hears of a worker's end as it happens (procwatch.py) and then calls `notify`, so
the manager reports it at once rather than at its next periodic round.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Protocol

from . import execfail, procwatch
from .files import read_int, read_json, write_json_atomic, write_text_atomic
from .supervise import (
    EXIT_FILE,
    STOP_GRACE_S,
    end_fields,
    mount_dirs,
    supervisor_argv,
    worker_env,
)
from .workdir import (
    SPAWNED,
    Worker,
    group_of,
    reap_spawned,
    runs_in,
    supervisor_alive,
)

ENV_FILE = "env.json"


def _nothing() -> None:
    """`notify` until a manager sets its own."""


class WorkerRuntime(Protocol):
    """What WorkerManager needs of a runtime. Every method but `poll` is quick and does not
    block on the runtime: slow work (podman calls) happens in `poll`, once per round."""

    name: str
    pulls_images: bool  # runs a job's own image (StartWorker.image), pulling it first
    secrets_uid: int  # who owns the worker's attached-key files (keyfiles.py)
    lost_at_restart: str  # the reason of a worker `reattach` could not find
    lost_at_runtime: str  # the reason of a worker `alive` stopped seeing without exit.json

    def launch(self, w: Worker) -> str | None:
        """Start the worker whose directory holds spec.json (and env.json). None, or why it
        could not even begin (the worker then fails with that error)."""

    def launched(self, w: Worker) -> bool:
        """Was it handed to the runtime (it counts as running until exit.json)?"""

    def alive(self, w: Worker) -> bool:
        """May it still write exit.json? False only when the runtime knows it is gone."""

    def request_stop(self, w: Worker) -> None:
        """`stop_requested` is written: stop it (exit.json then records `stopped`)."""

    def reattach(self, w: Worker) -> bool:
        """After an agent restart, for a worker without exit.json: is it still there?"""

    def kill_orphan(self, w: Worker) -> None:
        """It is being reported lost: end whatever of it may still hold GPUs."""

    notify: Callable[[], None]  # set by the manager: call it when a worker has news

    async def poll(self, workers: Sequence[Worker], full: bool = False) -> None:
        """Once per watch round, before the workers' files are read; `full`: the periodic
        safety-net round (check everything, even without news)."""


class ProcessRuntime:
    """Bare host processes, each under a detached shell supervisor (`supervise.py`) that
    survives the agent. The worker runs as the agent's user and sees the host: for an
    operator's own jobs on their own nodes, and for benchmarks."""

    name = "process"
    pulls_images = False  # a job's image is not used: the command runs on the host
    lost_at_restart = "worker lost: its supervisor was gone when the agent restarted"
    lost_at_runtime = "worker lost: its supervisor ended without recording the worker's end"

    def __init__(self, base_env: dict[str, str] | None = None) -> None:
        self.base_env = dict(os.environ) if base_env is None else base_env
        self.notify: Callable[[], None] = _nothing
        self._kill_at: dict[str, asyncio.TimerHandle] = {}
        self.secrets_uid = os.getuid()  # the command runs as the agent's user

    def launch(self, w: Worker) -> str | None:
        spec = read_json(w.file("spec.json")) or {}
        env_path = w.file(ENV_FILE)
        secrets = read_json(env_path) or {}
        env_path.unlink(missing_ok=True)  # the values live on only in the worker's env
        command = [str(a) for a in spec.get("command") or []]
        env = worker_env({**spec, "env": {**secrets}}, w.dir, self.base_env)
        output = w.file("output")
        output.mkdir(exist_ok=True)
        for d in mount_dirs(spec, w.dir).values():
            d.mkdir(parents=True, exist_ok=True)
        failed = execfail.cannot_start(command, env)
        if failed is not None:
            execfail.note(w.file("log"), failed)
            self._end(w, failed)
            return None
        with w.file("log").open("ab") as log:
            try:
                w.proc = subprocess.Popen(
                    supervisor_argv(w.dir, command),
                    stdin=subprocess.DEVNULL,
                    stdout=log,  # the command's stderr too (supervise.py)
                    stderr=subprocess.DEVNULL,
                    env=env,
                    cwd=output,
                    start_new_session=True,  # detached, and the leader of the worker's group
                    close_fds=True,
                )
            except OSError as exc:
                return f"cannot start the supervisor: {exc}"
        SPAWNED.append(w.proc)
        pid = w.proc.pid
        write_text_atomic(w.file("supervisor.pid"), f"{pid}\n")
        now = datetime.now(UTC).isoformat()
        write_json_atomic(w.file("started.json"), {"pid": pid, "started_at": now})
        self._watch(w, pid)
        return None

    def _end(self, w: Worker, fields: dict[str, object]) -> None:
        now = datetime.now(UTC).isoformat()
        write_json_atomic(w.file("exit.json"), {"ended_at": now, **fields})

    def _watch(self, w: Worker, pid: int) -> None:
        def ended() -> None:
            if w.proc is not None:
                w.proc.poll()  # reap it
            self.collect(w)
            self.notify()

        procwatch.watch(pid, ended)  # else the manager's periodic round finds the end

    def collect(self, w: Worker) -> bool:
        """The supervisor is gone: turn its `exit` into exit.json. True if it recorded one."""
        if w.file("exit.json").exists():
            return True
        fields = end_fields(w.dir)
        if fields is None:
            return False
        timer = self._kill_at.pop(w.placement_id, None)
        if timer is not None:
            timer.cancel()
        write_json_atomic(w.file("exit.json"), fields)
        w.file(EXIT_FILE).unlink(missing_ok=True)
        return True

    def launched(self, w: Worker) -> bool:
        return w.file("supervisor.pid").exists()

    def _alive(self, w: Worker) -> bool:
        if w.proc is not None:
            return w.proc.poll() is None  # also reaps it
        pid = read_int(w.file("supervisor.pid"))
        return pid is not None and supervisor_alive(pid, w.dir)

    def alive(self, w: Worker) -> bool:
        if self._alive(w):
            return True
        self.collect(w)  # ended: its exit.json, if it wrote its end
        return False

    def request_stop(self, w: Worker) -> None:
        """SIGTERM to the worker's process group; SIGKILL after its grace period, unless it
        has ended by then."""
        pid = read_int(w.file("supervisor.pid"))
        if pid is None or not self._alive(w):
            return
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGTERM)
        spec = read_json(w.file("spec.json")) or {}
        grace = float(spec.get("stop_grace_s", STOP_GRACE_S))
        with contextlib.suppress(RuntimeError):  # no loop: the next stop request kills it
            loop = asyncio.get_running_loop()
            old = self._kill_at.pop(w.placement_id, None)
            if old is not None:
                old.cancel()
            self._kill_at[w.placement_id] = loop.call_later(grace, self._kill, w, pid)

    def _kill(self, w: Worker, pid: int) -> None:
        self._kill_at.pop(w.placement_id, None)
        if self._alive(w):
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)

    def reattach(self, w: Worker) -> bool:
        pid = read_int(w.file("supervisor.pid"))
        if pid is None or not supervisor_alive(pid, w.dir):
            self.collect(w)
            return False
        self._watch(w, pid)
        if w.file("stop_requested").exists():
            self.request_stop(w)  # a stop the previous agent may not have seen through
        return True

    def kill_orphan(self, w: Worker) -> None:
        started = read_json(w.file("started.json")) or {}
        pgid = started.get("pid")  # the worker's process group (its leader may be gone)
        if not isinstance(pgid, int):
            return
        if any(runs_in(pid, w.dir) for pid in group_of(pgid)):
            # An orphaned command would hold GPUs the scheduler is about to reuse.
            with contextlib.suppress(OSError):
                os.killpg(pgid, signal.SIGKILL)

    async def poll(self, workers: Sequence[Worker], full: bool = False) -> None:
        reap_spawned()
