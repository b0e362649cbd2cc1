"""An embedded MongoDB: the nx-27017 wire-protocol server (SQLite underneath) as a child.

`--data-dir` gives one SQLite file per logical database, so each service's database is its
own file. Every instance gets its own `--pid-file` and `--log-file`: nx-27017 refuses to
start when the pid file names a live process, which would block a second instance.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any

from pymongo import MongoClient
from pymongo.errors import PyMongoError

from gpufleet_devstack._server import ServerProcess

__all__ = ["EmbeddedMongo", "nx_27017_command"]


def nx_27017_command() -> list[str]:
    """How to run nx-27017 with this interpreter (the package has no `__main__`)."""
    script = Path(sys.executable).parent / "nx-27017"
    if script.is_file():
        return [sys.executable, str(script)]
    return [
        sys.executable,
        "-c",
        "import sys; from nx_27017.nx_27017 import main; sys.exit(main())",
    ]


def _pid_alive(pid_file: Path) -> bool:
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class EmbeddedMongo(ServerProcess):
    """nx-27017 on `127.0.0.1:port` with its databases under `data_dir`.

    `restart()` reuses the port and the data dir; committed writes survive `kill()`.
    Its own log goes to `log_file` (default `<data_dir>.nx.log`), anything it prints
    (tracebacks) to `<log_file>.out`.
    """

    kind = "nx-27017"

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        host: str = "127.0.0.1",
        *,
        log_file: Path | None = None,
        pid_file: Path | None = None,
        journal_mode: str = "WAL",
        start_timeout: float = 20.0,
    ) -> None:
        data_dir = Path(data_dir).absolute()
        log_file = Path(log_file) if log_file else data_dir.parent / f"{data_dir.name}.nx.log"
        super().__init__(
            host=host,
            port=port,
            log_file=log_file,
            start_timeout=start_timeout,
        )
        self.data_dir = data_dir
        self.pid_file = Path(pid_file) if pid_file else data_dir.parent / f"{data_dir.name}.nx.pid"
        self.journal_mode = journal_mode

    @property
    def url(self) -> str:
        return f"mongodb://{self.host}:{self.port}/?directConnection=true"

    @property
    def tx_lock_dir(self) -> Path:
        """Where the services' transactions take turns across processes: nx-27017 cannot
        isolate two at once (gpufleet_store/txlock.py)."""
        return self.data_dir.parent / f"{self.data_dir.name}.txlocks"

    @property
    def service_env(self) -> dict[str, str]:
        """What a service needs to use this database."""
        return {"GPUFLEET_MONGO_URL": self.url, "GPUFLEET_MONGO_TX_LOCK_DIR": str(self.tx_lock_dir)}

    def client(self, **kwargs: Any) -> MongoClient[dict[str, Any]]:
        """A new pymongo client for this server (close it when done)."""
        options: dict[str, Any] = {"serverSelectionTimeoutMS": 5000, **kwargs}
        return MongoClient(self.url, **options)

    def _prepare(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        self.pid_file.parent.mkdir(parents=True, exist_ok=True)
        # After a kill -9 the pid file stays behind; nx-27017 would only accept it if
        # that pid is dead, so remove it ourselves when it is.
        if self.pid_file.exists() and not _pid_alive(self.pid_file):
            with contextlib.suppress(FileNotFoundError):
                self.pid_file.unlink()

    def _argv(self) -> list[str]:
        return [
            *nx_27017_command(),
            "--host", self.host,
            "-p", str(self.port),
            "--data-dir", str(self.data_dir),
            "--pid-file", str(self.pid_file),
            "--log-file", str(self.log_file),
            "--journal-mode", self.journal_mode,
        ]  # fmt: skip

    def _console_log(self) -> Path:
        return self.log_file.with_name(self.log_file.name + ".out")

    def _log_files(self) -> list[Path]:
        return [self.log_file, self._console_log()]

    def _ready(self) -> bool:
        client: MongoClient[dict[str, Any]] = MongoClient(
            self.url, serverSelectionTimeoutMS=500, connectTimeoutMS=500
        )
        try:
            client.admin.command("ping")
            return True
        except PyMongoError:
            return False
        finally:
            client.close()

    def __repr__(self) -> str:
        return f"EmbeddedMongo({self.url}, data_dir={self.data_dir}, running={self.running})"
