"""FTP on 127.0.0.1 (a `web` input's ftp:// URL): pyftpdlib serving the files under `root`,
read-only to anonymous, read-write to one user; FTPS (ftps://, explicit: AUTH TLS on the same
port, control and data connections both protected) when given a certificate (tls.py).

    python -m gpufleet_devstack.storage.ftp ROOT --host 127.0.0.1 --port N --user U \\
        --password-file F [--passive FROM-TO] [--cert C --key K]
"""

from __future__ import annotations

import argparse
import contextlib
import ftplib
import sys
from dataclasses import dataclass
from pathlib import Path

from gpufleet_auth import write_secret

from gpufleet_devstack.storage.rooted import RootedServer, running
from gpufleet_devstack.storage.tls import LocalTls

__all__ = ["FtpEndpoint", "FtpServer", "running_ftp"]

READ = "elr"  # change directory, list, retrieve
WRITE = "adfmwMT"  # append, delete, rename, make directories, store, chmod, set times


@dataclass(frozen=True)
class FtpEndpoint:
    """What an FTP client needs; `user` may write, anonymous may read."""

    host: str
    port: int
    user: str
    password: str
    secure: bool = False

    def url(self, path: str = "") -> str:
        """An anonymous URL of a file (a `web` input's form)."""
        scheme = "ftps" if self.secure else "ftp"
        return f"{scheme}://{self.host}:{self.port}/{path.lstrip('/')}"


class FtpServer(RootedServer):
    """pyftpdlib on `host:port` (FTPS with `tls`); data connections on `passive` ports (any
    free one when None)."""

    kind = "ftp (pyftpdlib)"
    log_name = "ftp"

    def __init__(
        self,
        root: Path,
        port: int | None = None,
        host: str = "127.0.0.1",
        *,
        user: str = "gpufleet",
        password: str = "gpufleet-dev",
        passive: tuple[int, int] | None = None,
        tls: LocalTls | None = None,
        log_file: Path | None = None,
        start_timeout: float | None = None,
    ) -> None:
        super().__init__(root, port, host, log_file=log_file, start_timeout=start_timeout)
        self.user = user
        self.password = password
        self.passive = passive
        self.tls = tls
        # the password in a file, not on the command line (where `ps` shows it)
        self.password_file = self.root.parent / f"{self.root.name}.ftp-password"

    @property
    def endpoint(self) -> FtpEndpoint:
        return FtpEndpoint(self.host, self.port, self.user, self.password, self.tls is not None)

    @property
    def ca_file(self) -> Path | None:
        """The CA a client must trust (FTPS), or None (FTP)."""
        return self.tls.ca if self.tls is not None else None

    def _prepare(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        write_secret(self.password_file, self.password)

    def _argv(self) -> list[str]:
        argv = [sys.executable, "-m", "gpufleet_devstack.storage.ftp", str(self.root)]
        argv += ["--host", self.host, "--port", str(self.port), "--user", self.user]
        argv += ["--password-file", str(self.password_file)]
        if self.passive is not None:
            argv += ["--passive", f"{self.passive[0]}-{self.passive[1]}"]
        if self.tls is not None:
            argv += ["--cert", str(self.tls.cert), "--key", str(self.tls.key)]
        return argv

    def _ready(self) -> bool:
        try:
            with ftplib.FTP() as ftp:
                ftp.connect(self.host, self.port, timeout=1)
                return True
        except (OSError, ftplib.Error):
            return False


def running_ftp(
    root: Path, tls: LocalTls | None = None
) -> contextlib.AbstractContextManager[FtpServer]:
    """An FtpServer of the files under `root` (FTPS with `tls`), for a block."""
    return running(FtpServer(root, tls=tls))


# -- the child ---------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    from pyftpdlib.authorizers import DummyAuthorizer
    from pyftpdlib.handlers import FTPHandler
    from pyftpdlib.servers import FTPServer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--user", required=True)
    parser.add_argument("--password-file", type=Path, required=True)
    parser.add_argument("--passive", help="FROM-TO: the data connections' ports")
    parser.add_argument("--cert", type=Path, help="FTPS: the certificate (chain)")
    parser.add_argument("--key", type=Path, help="FTPS: its private key")
    args = parser.parse_args(argv)
    root = str(args.root.absolute())
    authorizer = DummyAuthorizer()
    authorizer.add_user(args.user, args.password_file.read_text(), root, perm=READ + WRITE)
    authorizer.add_anonymous(root, perm=READ)

    base: type[FTPHandler] = FTPHandler
    if args.cert:
        from pyftpdlib.handlers import TLS_FTPHandler

        base = TLS_FTPHandler

    class Handler(base):  # type: ignore[misc]
        pass

    if args.cert:
        Handler.certfile, Handler.keyfile = str(args.cert), str(args.key)
        Handler.tls_control_required = True  # no login, no listing in the clear
        Handler.tls_data_required = True
    Handler.authorizer = authorizer
    Handler.permit_foreign_addresses = False  # data connections to the client's address only
    Handler.auth_failed_timeout = 0.5  # a wrong password's delay: 3 s by default
    if args.passive:
        low, high = (int(p) for p in args.passive.split("-", 1))
        Handler.passive_ports = list(range(low, high + 1))
    server = FTPServer((args.host, args.port), Handler)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
