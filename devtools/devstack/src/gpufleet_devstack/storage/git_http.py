"""git over HTTP on 127.0.0.1: `git http-backend` (git's own, as CGI) behind a small
threaded Python HTTP server, serving every bare repository under `root` (clone and push,
without authentication).

    python -m gpufleet_devstack.storage.git_http ROOT --host 127.0.0.1 --port N
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import io
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import IO, Any

from gpufleet_devstack.storage.repos import git_program
from gpufleet_devstack.storage.rooted import RootedServer, running

__all__ = ["GitHttp", "running_git_http"]

COPY_CHUNK = 64 * 1024


class GitHttp(RootedServer):
    """The git HTTP server on `host:port`; `url(name)` is a repository's clone URL."""

    kind = "git http-backend"
    log_name = "git-http"

    def url(self, name: str) -> str:
        return f"http://{self.address}/{name}"

    def _argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "gpufleet_devstack.storage.git_http",
            str(self.root),
            "--host",
            self.host,
            "--port",
            str(self.port),
        ]

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.address}/", timeout=1):
                return True
        except urllib.error.HTTPError:
            return True  # no repository at /: it answers
        except OSError:
            return False


def running_git_http(root: Path) -> contextlib.AbstractContextManager[GitHttp]:
    """A GitHttp serving the bare repositories under `root`, for a block."""
    return running(GitHttp(root))


# -- the child: the HTTP server in front of `git http-backend` ---------------------------


def _read_body(rfile: io.BufferedIOBase, headers: Any, into: IO[bytes]) -> None:
    """The request's body into `into`: by Content-Length, or chunked (git sends a push's
    pack in chunks)."""
    if "chunked" in headers.get("Transfer-Encoding", "").lower():
        while True:
            size = int(rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                while rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return
            into.write(rfile.read(size))
            rfile.readline()
    left = int(headers.get("Content-Length") or 0)
    while left > 0:
        data = rfile.read(min(left, COPY_CHUNK))
        if not data:
            return
        into.write(data)
        left -= len(data)


def handler(root: Path, backend: str) -> type[http.server.BaseHTTPRequestHandler]:
    class GitBackend(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._backend()

        def do_POST(self) -> None:
            self._backend()

        def _backend(self) -> None:
            path, _, query = self.path.partition("?")
            env = {
                "PATH": "/usr/local/bin:/usr/bin:/bin",
                "GIT_CONFIG_NOSYSTEM": "1",
                "GIT_CONFIG_GLOBAL": "/dev/null",
                "GIT_PROJECT_ROOT": str(root),
                "GIT_HTTP_EXPORT_ALL": "1",
                # a push needs a user (or http.receivepack); there is no authentication
                "REMOTE_USER": "gpufleet-dev",
                "REMOTE_ADDR": self.client_address[0],
                "GATEWAY_INTERFACE": "CGI/1.1",
                "REQUEST_METHOD": self.command,
                "PATH_INFO": urllib.parse.unquote(path),
                "QUERY_STRING": query,
                "CONTENT_TYPE": self.headers.get("Content-Type", ""),
            }
            for header, var in (
                ("Content-Encoding", "HTTP_CONTENT_ENCODING"),
                ("Git-Protocol", "GIT_PROTOCOL"),
            ):
                if self.headers.get(header):
                    env[var] = self.headers[header]
            with tempfile.TemporaryFile() as body:
                _read_body(self.rfile, self.headers, body)
                env["CONTENT_LENGTH"] = str(body.tell())
                body.seek(0)
                proc = subprocess.Popen(
                    [backend],
                    stdin=body,
                    stdout=subprocess.PIPE,
                    env=env,
                )
                assert proc.stdout is not None
                self._relay(proc.stdout)
                proc.wait()

        def _relay(self, out: IO[bytes]) -> None:
            """The CGI reply: its headers (a `Status:` one gives the code), then its body
            as it comes; the connection's end ends it."""
            status, headers = 200, []
            while (raw := out.readline()) not in (b"\r\n", b"\n"):
                if not raw:  # it ended before its headers did
                    self.send_error(502, "git http-backend gave no reply")
                    return
                name, _, value = raw.decode("latin-1").rstrip("\r\n").partition(":")
                if name.lower() == "status":
                    status = int(value.split()[0])
                else:
                    headers.append((name, value.strip()))
            self.send_response(status)
            for name, value in headers:
                self.send_header(name, value)
            self.send_header("Connection", "close")
            self.end_headers()
            shutil.copyfileobj(out, self.wfile, COPY_CHUNK)

    return GitBackend


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    server = http.server.ThreadingHTTPServer(
        (args.host, args.port), handler(args.root.absolute(), git_program("git-http-backend"))
    )
    server.daemon_threads = True
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
