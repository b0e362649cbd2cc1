"""Files over http or https on 127.0.0.1 (a `web` input's URL): a small threaded Python
server of the files under `root`, GET and HEAD as any static server, PUT to place one;
https with a certificate from tls.py.

    python -m gpufleet_devstack.storage.web ROOT --host 127.0.0.1 --port N [--cert C --key K]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import os
import ssl
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from gpufleet_devstack.storage.rooted import RootedServer, running
from gpufleet_devstack.storage.tls import LocalTls

__all__ = ["WebServer", "running_web"]

COPY_CHUNK = 64 * 1024


class WebServer(RootedServer):
    """The file server on `host:port` (https with `tls`); `url(path)` is a file's URL."""

    kind = "web files"
    log_name = "web"

    def __init__(
        self,
        root: Path,
        port: int | None = None,
        host: str = "127.0.0.1",
        *,
        tls: LocalTls | None = None,
        log_file: Path | None = None,
        start_timeout: float | None = None,
    ) -> None:
        super().__init__(root, port, host, log_file=log_file, start_timeout=start_timeout)
        self.tls = tls

    @property
    def ca_file(self) -> Path | None:
        """The CA a client must trust (https), or None (http)."""
        return self.tls.ca if self.tls is not None else None

    def url(self, path: str = "") -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://{self.address}/{urllib.parse.quote(path.lstrip('/'))}"

    def _argv(self) -> list[str]:
        argv = [sys.executable, "-m", "gpufleet_devstack.storage.web", str(self.root)]
        argv += ["--host", self.host, "--port", str(self.port)]
        if self.tls is not None:
            argv += ["--cert", str(self.tls.cert), "--key", str(self.tls.key)]
        return argv

    def _ready(self) -> bool:
        context = ssl.create_default_context(cafile=self.tls.ca) if self.tls else None
        try:
            with urllib.request.urlopen(self.url(), timeout=1, context=context):
                return True
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False


def running_web(
    root: Path, tls: LocalTls | None = None
) -> contextlib.AbstractContextManager[WebServer]:
    """A WebServer of the files under `root` (https with `tls`), for a block."""
    return running(WebServer(root, tls=tls))


# -- the child ---------------------------------------------------------------------------


class FilesHandler(http.server.SimpleHTTPRequestHandler):
    """GET and HEAD from the directory; PUT writes a file under it (never outside: the
    path is resolved first), whole or not at all."""

    def do_PUT(self) -> None:
        root = Path(self.directory).resolve()
        relative = urllib.parse.unquote(self.path.split("?", 1)[0]).lstrip("/")
        target = (root / relative).resolve()
        if not relative or root not in target.parents:
            self.send_error(403, "outside the served directory")
            return
        length = int(self.headers.get("Content-Length") or -1)
        if length < 0:
            self.send_error(411, "Content-Length required")
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=target.parent, delete=False) as tmp:
            while length > 0:
                data = self.rfile.read(min(length, COPY_CHUNK))
                if not data:
                    break
                tmp.write(data)
                length -= len(data)
        if length > 0:
            os.unlink(tmp.name)
            self.send_error(400, "the body ended early")
            return
        os.replace(tmp.name, target)
        self.send_response(201)
        self.send_header("Content-Length", "0")
        self.end_headers()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cert", type=Path)
    parser.add_argument("--key", type=Path)
    args = parser.parse_args(argv)
    handler: Any = functools.partial(FilesHandler, directory=str(args.root.absolute()))
    server = http.server.ThreadingHTTPServer((args.host, args.port), handler)
    server.daemon_threads = True
    if args.cert is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(args.cert, args.key)
        # the handshake in the connection's thread, not in the accepting one
        server.socket = context.wrap_socket(
            server.socket, server_side=True, do_handshake_on_connect=False
        )
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
