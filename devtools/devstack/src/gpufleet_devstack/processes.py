"""Child-process plumbing shared by the servers and the service supervisor.

Every child is started in its own session (process group) so that a Ctrl-C in the
developer's terminal reaches only the parent, which then stops the children in order
instead of having them all die at once in a random order.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import signal
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

__all__ = [
    "DevstackError",
    "PortInUseError",
    "ServiceProcess",
    "apt_install",
    "free_port",
    "log_tail",
    "port_in_use",
    "terminate",
    "wait_for",
    "wait_for_async",
]

DEFAULT_STOP_TIMEOUT = 10.0


class DevstackError(RuntimeError):
    """A server or service could not be started or stopped."""


class PortInUseError(DevstackError):
    """The requested TCP port is already taken by another process."""


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that was free a moment ago (the kernel picks it: bind to port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """True when something listens on host:port.

    Binds with SO_REUSEADDR, like the servers do, so a port that only has connections in
    TIME_WAIT (for example right after a kill -9) still counts as free.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
        return False


def tcp_accepts(host: str, port: int, timeout: float = 0.25) -> bool:
    """True when a TCP connection to host:port succeeds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def log_tail(path: Path | None, lines: int = 30) -> str:
    """The last `lines` lines of a log file, or a note when there is none."""
    if path is None:
        return "(no log file)"
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            data = fh.read().decode("utf-8", errors="replace")
    except OSError as exc:
        return f"(cannot read {path}: {exc})"
    tail = data.splitlines()[-lines:]
    return "\n".join(tail) if tail else f"({path} is empty)"


def wait_for(
    predicate: Callable[[], object],
    timeout: float = 10.0,
    interval: float = 0.05,
    message: str | None = None,
) -> None:
    """Poll `predicate` until it returns something truthy; raise TimeoutError after `timeout` s.

    Exceptions raised by the predicate count as "not yet" (the last one is chained).
    """
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            if predicate():
                return
            last_exc = None
        except Exception as exc:
            last_exc = exc
        if time.monotonic() >= deadline:
            raise TimeoutError(message or f"condition not met within {timeout:.1f}s") from last_exc
        time.sleep(interval)


async def wait_for_async(
    predicate: Callable[[], object | Awaitable[object]],
    timeout: float = 10.0,  # noqa: ASYNC109 - same signature as wait_for
    interval: float = 0.05,
    message: str | None = None,
) -> None:
    """Async `wait_for`: the predicate may be a plain or a coroutine function."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            result = predicate()
            if inspect.isawaitable(result):
                result = await result
            if result:
                return
            last_exc = None
        except Exception as exc:
            last_exc = exc
        if loop.time() >= deadline:
            raise TimeoutError(message or f"condition not met within {timeout:.1f}s") from last_exc
        await asyncio.sleep(interval)


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    """Send `sig` to the child's whole process group (it leads its own session)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def terminate(proc: subprocess.Popen[bytes], timeout: float = DEFAULT_STOP_TIMEOUT) -> int | None:
    """SIGTERM the child, wait up to `timeout` s, then SIGKILL its process group.

    Returns the exit code (negative for a signal), None if it could not be reaped.
    """
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
    return proc.returncode


def apt_install(packages: Sequence[str], log: Callable[[str], None] = print) -> bool:
    """`apt-get install -y packages` (after an `apt-get update` if the first try fails), as
    root only; whether it succeeded."""
    if os.geteuid() != 0:
        return False
    cmd = ["apt-get", "install", "-y", *packages]
    log(f"running: {' '.join(cmd)}")
    if subprocess.run(cmd, check=False).returncode == 0:
        return True
    subprocess.run(["apt-get", "update"], check=False)
    return subprocess.run(cmd, check=False).returncode == 0


def spawn(
    argv: Sequence[str],
    log_file: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start `argv` in its own session with stdout+stderr appended to `log_file`."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("ab") as log:
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
        )


class ServiceProcess:
    """One supervised child process (a gpufleet service, or anything else).

    `env` is the child's complete environment (None: inherit the parent's); merge
    `os.environ` yourself when you want to add to it. stdout and stderr are appended to
    `log_file`.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str] | None,
        log_file: Path,
        *,
        cwd: Path | None = None,
        stop_timeout: float = DEFAULT_STOP_TIMEOUT,
    ) -> None:
        if not argv:
            raise ValueError("argv must not be empty")
        self.name = name
        self.argv = list(argv)
        self.env = dict(env) if env is not None else None
        self.log_file = Path(log_file)
        self.cwd = cwd
        self.stop_timeout = stop_timeout
        self.starts = 0
        self._proc: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:
        return f"ServiceProcess({self.name!r}, pid={self.pid}, alive={self.alive})"

    @property
    def pid(self) -> int | None:
        """The child's pid while it runs (or last ran), None before the first start."""
        return self._proc.pid if self._proc is not None else None

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """Exit code of the last run (negative: killed by that signal); None while alive."""
        return self._proc.poll() if self._proc is not None else None

    def start(self) -> None:
        if self.alive:
            raise DevstackError(f"{self.name} is already running (pid {self.pid})")
        self._proc = spawn(self.argv, self.log_file, env=self.env, cwd=self.cwd)
        self.starts += 1

    def stop(self, timeout: float | None = None) -> int | None:
        """SIGTERM, then SIGKILL (whole process group) after `timeout` (default stop_timeout)."""
        if self._proc is None:
            return None
        return terminate(self._proc, self.stop_timeout if timeout is None else timeout)

    def kill(self, group: bool = False) -> None:
        """SIGKILL the child (and its process group when `group`), for fault tests."""
        if self._proc is None:
            return
        if group:
            _signal_group(self._proc, signal.SIGKILL)
        elif self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=5)

    def restart(self) -> None:
        self.stop()
        self.start()

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the child to exit; its exit code, or None on timeout."""
        if self._proc is None:
            return None
        try:
            return self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def __enter__(self) -> ServiceProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
