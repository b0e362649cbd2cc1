"""The worker runtime port: how a placement's worker is run, watched, stopped and found
again after a restart. WorkerManager (workers.py) keeps the state in the worker's directory
and reports; a runtime only runs the worker and writes the files of the supervisor protocol
(`supervise.py`): `started.json` when it runs, `log`, and `exit.json` when it has ended.

Two implementations, chosen by `GPUFLEET_WORKER_RUNTIME`:

- `process` (default): a detached supervisor process per worker, the command a bare host
  process (`ProcessRuntime`, below).
- `podman`: each worker in its own OCI container through the podman CLI (`podman.py`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from typing import Protocol

from .files import read_int, read_json, write_text_atomic
from .workdir import (
    SPAWNED,
    SUPERVISOR_MODULE,
    Worker,
    pid_alive,
    reap_spawned,
    runs_in,
    supervisor_alive,
)


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

    async def poll(self, workers: Sequence[Worker]) -> None:
        """Once per watch round, before the workers' files are read."""


class ProcessRuntime:
    """Bare host processes, each under a detached supervisor (`supervise.py`) that survives
    the agent. The worker runs as the agent's user and sees the host: for an operator's own
    jobs on their own nodes, and for benchmarks."""

    name = "process"
    pulls_images = False  # a job's image is not used: the command runs on the host
    lost_at_restart = "worker lost: its supervisor was gone when the agent restarted"
    lost_at_runtime = "worker lost: its supervisor ended without recording the worker's end"

    def __init__(self, python: str = sys.executable) -> None:
        self.python = python
        self.secrets_uid = os.getuid()  # the command runs as the agent's user

    def launch(self, w: Worker) -> str | None:
        try:
            w.proc = subprocess.Popen(
                [self.python, "-m", SUPERVISOR_MODULE, str(w.dir)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # detached: survives the agent
                close_fds=True,
            )
        except OSError as exc:
            return f"cannot start the supervisor: {exc}"
        SPAWNED.append(w.proc)
        write_text_atomic(w.file("supervisor.pid"), f"{w.proc.pid}\n")
        return None

    def launched(self, w: Worker) -> bool:
        return w.file("supervisor.pid").exists()

    def alive(self, w: Worker) -> bool:
        if w.proc is not None:
            return w.proc.poll() is None  # also reaps it
        pid = read_int(w.file("supervisor.pid"))
        return pid is not None and supervisor_alive(pid, w.dir)

    def request_stop(self, w: Worker) -> None:
        pid = read_int(w.file("supervisor.pid"))
        if pid is not None and supervisor_alive(pid, w.dir):
            os.kill(pid, signal.SIGTERM)

    def reattach(self, w: Worker) -> bool:
        pid = read_int(w.file("supervisor.pid"))
        return pid is not None and supervisor_alive(pid, w.dir)

    def kill_orphan(self, w: Worker) -> None:
        started = read_json(w.file("started.json")) or {}
        pid = started.get("pid")
        if isinstance(pid, int) and pid_alive(pid) and runs_in(pid, w.dir):
            # An orphaned command would hold GPUs the scheduler is about to reuse.
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)

    async def poll(self, workers: Sequence[Worker]) -> None:
        reap_spawned()
