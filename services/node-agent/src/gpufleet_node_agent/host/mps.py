"""Fractional GPUs enforced with CUDA MPS (R-SCHED-4; services/node-agent/README.md,
"Fractional GPUs").

Each share (a worker placed with `gpu_fraction` on a real GPU) gets its own MPS control
daemon, started by the agent as root before the container, with its own pipe directory and
its GPU alone visible (`CUDA_VISIBLE_DEVICES=<uuid>`). The agent sets that daemon's default
active thread percentage (the share of the GPU's SMs) and default pinned device memory limit
(the share of its memory), then starts its server for the workers' uid. The container gets
the pipe directory (at MPS_TARGET) and nothing else of MPS.

Why this holds against the job (seen on an H100, devtools/gpucheck/README.md): a client's
own `CUDA_MPS_*` variables can only lower the daemon's limits, and the daemon refuses
settings from any user but the one that started it ("Insufficient privileges for UID
10000"). A daemon per share rather than per GPU because a daemon's limits are one value for
all its clients, and the shares of one GPU may differ in size; the shares of a GPU are then
separate MPS servers (separate contexts), each capped, the GPU time-sliced between them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Iterable
from decimal import Decimal
from pathlib import Path

log = logging.getLogger(__name__)

MPS_TARGET = "/tmp/nvidia-mps"  # CUDA_MPS_PIPE_DIRECTORY inside the container
CONTROL = "nvidia-cuda-mps-control"
CONTROL_DIRS = ("/usr/bin", "/usr/local/nvidia/bin", "/usr/local/bin")
PID_FILE = "nvidia-cuda-mps-control.pid"


def find_control(setting: str | None = None) -> str | None:
    """The control daemon: the setting, else on PATH or where drivers put it."""
    if setting:
        return setting if os.access(setting, os.X_OK) else None
    found = shutil.which(CONTROL)
    if found:
        return found
    for d in CONTROL_DIRS:
        p = Path(d) / CONTROL
        if os.access(p, os.X_OK):
            return str(p)
    return None


def thread_percentage(fraction: Decimal | str | float) -> int:
    return max(1, min(100, round(float(fraction) * 100)))


def share_commands(fraction: Decimal | str | float, memory_mb: int, uid: int) -> list[str]:
    """What the agent tells a share's control daemon, in order (pure)."""
    return [
        f"set_default_active_thread_percentage {thread_percentage(fraction)}",
        f"set_default_device_pinned_mem_limit 0 {int(memory_mb)}M",
        f"start_server -uid {int(uid)}",
    ]


def share_env() -> dict[str, str]:
    """The container's side: where its MPS pipes are."""
    return {"CUDA_MPS_PIPE_DIRECTORY": MPS_TARGET}


def closed_ancestor(path: Path) -> Path | None:
    """The first directory on the way to `path` that others may not search. The MPS server
    runs as the workers' uid and makes its pipes in the share's directory: every directory
    above must be o+x (the agent's state directory under /root is not: GPUFLEET_MPS_DIR).
    Only checks: directories not made yet are skipped (the caller makes them o+x)."""
    for d in [path, *path.parents]:
        if d.is_dir() and not d.stat().st_mode & 0o001:
            return d
    return None


class Mps:
    """The control daemons of this node's shares, under `root/<placement>/`. Its calls block
    (a few control commands): the runtime makes them in a thread."""

    def __init__(self, root: Path, control: str | None, uid: int) -> None:
        self.root = root
        self.control = control
        self.uid = uid

    def pipe_dir(self, placement: str) -> Path:
        return self.root / placement / "pipe"

    def _env(self, placement: str, uuid: str | None = None) -> dict[str, str]:
        d = self.root / placement
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "CUDA_MPS_PIPE_DIRECTORY": str(d / "pipe"),
            "CUDA_MPS_LOG_DIRECTORY": str(d / "log"),
        }
        if uuid:
            env["CUDA_VISIBLE_DEVICES"] = uuid
        return env

    def _run(
        self, placement: str, args: list[str], stdin: bytes | None = None, uuid: str | None = None
    ) -> tuple[int, str]:
        assert self.control is not None
        daemon = args == ["-d"]
        try:
            done = subprocess.run(
                [self.control, *args],
                input=None if daemon else stdin or b"",
                # the daemon outlives this call: never on a pipe of ours (it would die of
                # SIGPIPE at its next write), and in a session of its own
                stdin=subprocess.DEVNULL if daemon else None,
                stdout=subprocess.DEVNULL if daemon else subprocess.PIPE,
                stderr=subprocess.DEVNULL if daemon else subprocess.STDOUT,
                start_new_session=daemon,
                env=self._env(placement, uuid),
                timeout=30,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return -1, "timed out"
        except OSError as exc:
            return -1, str(exc)
        out = done.stdout.decode(errors="replace").strip() if done.stdout else ""
        return done.returncode, out

    def _daemon_pid(self, placement: str) -> int | None:
        try:
            pid = int((self.pipe_dir(placement) / PID_FILE).read_text().strip())
            os.kill(pid, 0)
        except (OSError, ValueError):
            return None
        return pid

    def start(
        self, placement: str, uuid: str, fraction: Decimal | str | float, memory_mb: int
    ) -> str | None:
        """The share's daemon, limited and with its server up; None, or why not (the worker
        then fails: a share is never run without its limits)."""
        if self.control is None:
            return (
                "fractional GPU: the NVIDIA MPS control daemon (nvidia-cuda-mps-control) "
                "is not on this node, so a share's limits cannot be enforced"
            )
        self.root.mkdir(parents=True, exist_ok=True, mode=0o711)
        unreachable = closed_ancestor(self.root)
        if unreachable is not None:
            return (
                f"fractional GPU: the MPS directory {self.root} is not reachable by the "
                f"workers' user ({unreachable} is not searchable by others)"
            )
        d = self.root / placement
        for sub in ("pipe", "log"):
            (d / sub).mkdir(parents=True, exist_ok=True)
            os.chmod(d / sub, 0o755)
        os.chmod(d, 0o755)
        if self._daemon_pid(placement) is None:
            rc, out = self._run(placement, ["-d"], uuid=uuid)
            if rc != 0:
                return f"fractional GPU: the MPS control daemon did not start ({rc}): {out}"
        for cmd in share_commands(fraction, memory_mb, self.uid):
            rc, out = self._run(placement, [], stdin=(cmd + "\n").encode())
            if rc != 0 or "rror" in out or "nsufficient" in out:
                self.stop(placement)
                return f"fractional GPU: MPS refused {cmd.split()[0]}: {out}"
        _, servers = self._run(placement, [], stdin=b"get_server_list\n")
        if not servers.strip():
            self.stop(placement)
            return "fractional GPU: the MPS server did not start"
        log.info(
            "MPS share for %s: %d%% of the SMs, %d MiB, server %s",
            placement,
            thread_percentage(fraction),
            memory_mb,
            servers.split()[0],
        )
        return None

    def stop(self, placement: str, *, keep_log: bool = True) -> None:
        """Quit the share's daemon (its server with it) and remove its pipes; its log stays
        for the operator until the next sweep. Idempotent."""
        d = self.root / placement
        if not d.exists():
            return
        if self.control is not None and self._daemon_pid(placement) is not None:
            self._run(placement, [], stdin=b"quit\n")
            for _ in range(50):
                if self._daemon_pid(placement) is None:
                    break
                time.sleep(0.1)
        with contextlib.suppress(OSError):
            shutil.rmtree(d / "pipe" if keep_log else d)

    def placements(self) -> list[str]:
        try:
            return sorted(p.name for p in self.root.iterdir() if p.is_dir())
        except OSError:
            return []

    def sweep(self, keep: Iterable[str]) -> None:
        """After a restart: the daemons of shares whose worker is gone."""
        live = set(keep)
        for placement in self.placements():
            if placement not in live:
                self.stop(placement, keep_log=False)
