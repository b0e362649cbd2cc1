"""One worker (`Worker`) and its directory and processes: the placement's directory name,
whether a supervisor (or the command it runs) is still alive, and the supervisors to reap."""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import subprocess
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from gpufleet_contracts.jobs import StagingItem

from ..runtimes.supervise import is_supervisor
from .spec import WorkerSpec

LAUNCHED = "launch"  # done_at's key of the launch
_SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")

# Supervisors this process spawned, until they are reaped. Module-wide, so that one that
# outlives its WorkerManager (an in-process agent restart) is still reaped, not a zombie.
SPAWNED: list[subprocess.Popen[bytes]] = []


def reap_spawned() -> None:
    SPAWNED[:] = [p for p in SPAWNED if p.poll() is None]


def dir_name(placement_id: str) -> str:
    """A placement id as a directory name (hashed when it is not a safe file name)."""
    if _SAFE_ID.fullmatch(placement_id):
        return placement_id
    return "h-" + hashlib.sha256(placement_id.encode()).hexdigest()[:40]


def proc_args(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # some other user's process: not ours
        return False
    return not _is_zombie(pid)


def supervisor_alive(pid: int, worker_dir: Path) -> bool:
    """Is `pid` alive and the supervisor of `worker_dir`? (The cmdline guards against pid reuse.)"""
    if not pid_alive(pid):
        return False
    return is_supervisor(proc_args(pid), worker_dir)


def runs_in(pid: int, worker_dir: Path) -> bool:
    """Is `pid` this worker's command? Its environment names the worker's output directory."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"ML_OUTPUT_PATH={worker_dir / 'output'}".encode() in environ.split(b"\0")


def group_of(pgid: int) -> list[int]:
    """The live processes of process group `pgid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            found.append(int(entry.name))
    return found


@dataclass(eq=False)
class Worker:
    """One placement's worker: its spec (read once), its directory, and what the agent
    learnt of it and need not read again each watch round (issue 15)."""

    spec: WorkerSpec
    dir: Path
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)  # ours to reap
    _files: dict[str, Path] = field(default_factory=dict, init=False, repr=False)
    started: dict[str, Any] | None = field(default=None, init=False, repr=False)
    reported_started: bool = field(default=False, init=False, repr=False)
    log_shipped: int = field(default=-1, init=False, repr=False)  # log bytes
    # The step pipeline (pipeline.py): its setups and launch are running; a stop came for it
    # meanwhile; what its steps made that the launch needs, by step; its teardown is done.
    setting_up: bool = field(default=False, init=False, repr=False)
    stop_asked: bool = field(default=False, init=False, repr=False)
    made: dict[str, str] = field(default_factory=dict, init=False, repr=False)
    torn_down: bool = field(default=False, init=False, repr=False)
    # When each of its steps' setups ended, and its launch (LAUNCHED), as this agent saw
    # them: an endpoint's cold start phases (proxy/served.py). Not kept across a restart.
    done_at: dict[str, datetime] = field(default_factory=dict, init=False, repr=False)
    # Its teardown's own task (pipeline.py); how far its staging is, by item (progress.py),
    # and when its upload began (the outputs step): what the watch rounds report of it.
    tearing: asyncio.Task[None] | None = field(default=None, init=False, repr=False)
    staging: dict[str, StagingItem] = field(default_factory=dict, init=False, repr=False)
    staging_seq: int = field(default=0, init=False, repr=False)  # bumped on each change
    uploading_at: datetime | None = field(default=None, init=False, repr=False)
    reported_uploading: bool = field(default=False, init=False, repr=False)
    staging_sent: int = field(default=0, init=False, repr=False)  # the seq last reported
    staging_sent_at: float = field(default=-1e9, init=False, repr=False)  # monotonic

    @property
    def placement_id(self) -> str:
        return self.spec.placement_id

    @property
    def job_id(self) -> str:
        return self.spec.job_id

    @property
    def worker(self) -> int:
        return self.spec.worker

    @property
    def runtime(self) -> str:
        """The name of the runtime that runs it ("": the manager's default)."""
        return self.spec.runtime

    @property
    def key(self) -> str:
        return f"{self.job_id}/{self.worker}"

    def file(self, name: str) -> Path:
        """`dir / name`, made once: the watch rounds ask for the same few files of every
        worker many times a second, and a pathlib join (and its str) is most of such a
        check's CPU (issue 15)."""
        path = self._files.get(name)
        if path is None:
            path = self._files[name] = self.dir / name
        return path
