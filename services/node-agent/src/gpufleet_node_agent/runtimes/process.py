"""Bare host processes, each under a detached shell supervisor (`supervise.py`) that
survives the agent: the runtime of the operator's opt-in for the node owner's own jobs
(policy.py), and of benchmarks. The worker runs as the agent's user and sees the host."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

from ..staging.registry import Fetchers, Uploaders
from ..steps.base import Step, WorkerFailed
from ..steps.inputs import InputsStep
from ..steps.keys import KeysStep
from ..steps.outputs import OutputsStep
from ..worker.files import read_int, read_json, write_json_atomic, write_text_atomic
from ..worker.layout import ENV_FILE, OUTPUT_DIR
from ..worker.progress import progress_for
from ..worker.workdir import (
    SPAWNED,
    Worker,
    group_of,
    reap_spawned,
    runs_in,
    supervisor_alive,
)
from . import execfail, procwatch
from .supervise import EXIT_FILE, end_fields, mount_dirs, supervisor_argv, worker_env


def _nothing() -> None:
    """`notify` until a manager sets its own."""


def _input_dirs(w: Worker) -> list[Path]:
    """Without containers there are no binds: each mount of its plan is a directory under the
    worker's, named by the mount's variable (supervise.mount_dirs)."""
    return list(mount_dirs(w.spec, w.dir).values())


def _output_dirs(w: Worker) -> list[Path]:
    """Its output directory (ML_OUTPUT_PATH), also its working directory."""
    return [w.file(OUTPUT_DIR)]


ENDPOINTS_IN_CONTAINERS = "endpoints are served from containers only, not bare processes"


class ProcessRuntime:
    """Its workers need their attached keys as files (the agent's user owns them), their
    mounts' directories and their output directory: the keys, inputs and outputs steps."""

    name = "process"
    pulls_images = False  # a job's image is not used: the command runs on the host
    lost_at_restart = "worker lost: its supervisor was gone when the agent restarted"
    lost_at_runtime = "worker lost: its supervisor ended without recording the worker's end"

    def __init__(
        self,
        base_env: dict[str, str] | None = None,
        *,
        fetchers: Fetchers | None = None,
        uploaders: Uploaders | None = None,
        regional: Sequence[Step] = (),
    ) -> None:
        self.base_env = dict(os.environ) if base_env is None else base_env
        self.notify: Callable[[], None] = _nothing
        self._kill_at: dict[str, asyncio.TimerHandle] = {}
        self.steps: tuple[Step, ...] = (
            KeysStep(os.getuid()),  # the command runs as the agent's user
            *regional,  # datastores mounted before the inputs; a reservation published
            InputsStep(_input_dirs, fetchers, progress_for=progress_for, writable=True),
            OutputsStep(_output_dirs, uploaders),
        )

    async def launch(self, w: Worker) -> None:
        if w.spec.serving is not None:  # the proxy reaches a worker by its container's socket
            raise WorkerFailed(ENDPOINTS_IN_CONTAINERS)
        env_path = w.file(ENV_FILE)
        secrets = read_json(env_path) or {}
        env_path.unlink(missing_ok=True)  # the values live on only in the worker's env
        command = list(w.spec.command)
        env = worker_env(w.spec, w.dir, self.base_env, {str(k): str(v) for k, v in secrets.items()})
        failed = execfail.cannot_start(command, env)
        if failed is not None:
            execfail.note(w.file("log"), failed)
            self._end(w, failed)
            return
        with w.file("log").open("ab") as log:
            try:
                w.proc = subprocess.Popen(  # noqa: ASYNC220 - started, never waited for
                    supervisor_argv(w.dir, command),
                    stdin=subprocess.DEVNULL,
                    stdout=log,  # the command's stderr too (supervise.py)
                    stderr=subprocess.DEVNULL,
                    env=env,
                    cwd=w.file(OUTPUT_DIR),
                    start_new_session=True,  # detached, and the leader of the worker's group
                    close_fds=True,
                )
            except OSError as exc:
                raise WorkerFailed(f"cannot start the supervisor: {exc}") from None
        SPAWNED.append(w.proc)
        pid = w.proc.pid
        write_text_atomic(w.file("supervisor.pid"), f"{pid}\n")
        now = datetime.now(UTC).isoformat()
        write_json_atomic(w.file("started.json"), {"pid": pid, "started_at": now})
        self._watch(w, pid)

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
        grace = w.spec.stop_grace_s
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
