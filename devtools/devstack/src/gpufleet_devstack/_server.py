"""The part NatsServer and EmbeddedMongo share: one listening child process on a fixed port."""

from __future__ import annotations

import contextlib
import subprocess
import time
from pathlib import Path

from gpufleet_devstack.processes import (
    DEFAULT_STOP_TIMEOUT,
    DevstackError,
    PortInUseError,
    free_port,
    log_tail,
    port_in_use,
    spawn,
    tcp_accepts,
    terminate,
)

POLL_INTERVAL = 0.05


class ServerProcess:
    """A server child bound to `host:port`; the port stays the same across restarts."""

    kind = "server"

    def __init__(self, host: str, port: int | None, log_file: Path, start_timeout: float) -> None:
        self.host = host
        # None: a free port chosen here, and chosen again if it is taken before the first
        # start (an outgoing connection's ephemeral port can be any free one)
        self.port = port if port is not None else free_port(host)
        self._port_chosen = port is None
        self.log_file = log_file
        self.start_timeout = start_timeout
        self._proc: subprocess.Popen[bytes] | None = None

    # -- what a subclass provides -------------------------------------------------------
    def _argv(self) -> list[str]:
        raise NotImplementedError

    def _ready(self) -> bool:
        """Whether the server answers; only called once the port accepts TCP."""
        raise NotImplementedError

    def _prepare(self) -> None:
        """Runs before each start (create directories, clean stale files)."""

    def _console_log(self) -> Path:
        """Where the child's stdout and stderr go."""
        return self.log_file

    def _log_files(self) -> list[Path]:
        """The files whose tails explain a failed start."""
        return [self.log_file]

    # -- lifecycle ----------------------------------------------------------------------
    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _describe_logs(self) -> str:
        return "\n".join(f"--- tail of {p} ---\n{log_tail(p)}" for p in self._log_files())

    def start(self) -> None:
        """Start the server and wait until it is ready; a no-op when it already runs."""
        if self.running:
            return
        if port_in_use(self.port, self.host):
            if not self._port_chosen or self._proc is not None:  # given, or ours before
                raise PortInUseError(
                    f"cannot start {self.kind}: port {self.host}:{self.port} is already in use"
                )
            while port_in_use(self.port, self.host):  # taken since it was chosen
                self.port = free_port(self.host)
        self._prepare()
        proc = spawn(self._argv(), self._console_log())
        self._proc = proc
        deadline = time.monotonic() + self.start_timeout
        while True:
            code = proc.poll()
            if code is not None:
                raise DevstackError(
                    f"{self.kind} exited with code {code} during start-up "
                    f"(command: {' '.join(self._argv())})\n{self._describe_logs()}"
                )
            if tcp_accepts(self.host, self.port) and self._ready():
                return
            if time.monotonic() >= deadline:
                terminate(proc, timeout=2)
                raise DevstackError(
                    f"{self.kind} on {self.host}:{self.port} not ready after "
                    f"{self.start_timeout:.0f}s\n{self._describe_logs()}"
                )
            time.sleep(POLL_INTERVAL)

    def stop(self, timeout: float = DEFAULT_STOP_TIMEOUT) -> None:
        """SIGTERM, wait up to `timeout` s, then SIGKILL."""
        if self._proc is not None:
            terminate(self._proc, timeout)

    def kill(self) -> None:
        """SIGKILL, no clean shutdown: simulates a crash."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)

    def restart(self) -> None:
        """Stop (if running) and start again on the same port with the same data."""
        self.stop()
        self.start()

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
