"""What the storage servers share: a server of one directory, `root`, on `host:port`, its
log beside `root` (`<root>.<log_name>.log`) unless given."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar, TypeVar

from gpufleet_devstack._server import ServerProcess

S = TypeVar("S", bound=ServerProcess)


@contextlib.contextmanager
def running(server: S) -> Iterator[S]:
    """`server` started for a block, stopped when it ends."""
    server.start()
    try:
        yield server
    finally:
        server.stop()


class RootedServer(ServerProcess):
    log_name: ClassVar[str]
    start_timeout_s: ClassVar[float] = 15.0

    def __init__(
        self,
        root: Path,
        port: int | None = None,
        host: str = "127.0.0.1",
        *,
        log_file: Path | None = None,
        start_timeout: float | None = None,
    ) -> None:
        root = Path(root).absolute()
        log_file = log_file or root.parent / f"{root.name}.{self.log_name}.log"
        super().__init__(host, port, log_file, start_timeout or self.start_timeout_s)
        self.root = root

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def _prepare(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
