"""A PEP 503 package index of wheels made on the spot, for tests of package builds (R-JOB-7):
served on the host's own non-loopback address, which a build container's slirp4netns reaches
(the host's loopback it does not). Nothing comes from PyPI."""

from __future__ import annotations

import base64
import hashlib
import http.server
import socket
import threading
import urllib.request
import zipfile
from pathlib import Path
from typing import Any


def debian_reachable() -> bool:
    """Can Debian's archive be reached (a build installs pip from it)?"""
    try:
        with urllib.request.urlopen(
            "http://deb.debian.org/debian/dists/bookworm/Release", timeout=10
        ) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def host_address() -> str | None:
    """The host's own non-loopback address, or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: only the route is looked up
        except OSError:
            return None
        addr = str(s.getsockname()[0])
    return None if addr.startswith("127.") else addr


def wheel(dist: Path, name: str, version: str, source: str) -> None:
    """A pure-Python wheel of module `name` whose __init__ is `source`, in `dist`'s simple
    index (`dist/simple/<name>/`)."""
    module = name.replace("-", "_")
    info = f"{module}-{version}.dist-info"
    files = {
        f"{module}/__init__.py": source,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = "\n".join(record) + "\n"
    project = dist / "simple" / name
    project.mkdir(parents=True, exist_ok=True)
    filename = f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(project / filename, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    links = "".join(f'<a href="{f.name}">{f.name}</a>\n' for f in sorted(project.glob("*.whl")))
    (project / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")


class LocalIndex:
    """`root`'s files over HTTP on `address`; `url` is the simple index; `requests` the paths
    asked for."""

    def __init__(self, root: Path, address: str) -> None:
        self.root = root
        self.requests: list[str] = []
        requests = self.requests

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *a: Any, **kw: Any) -> None:
                super().__init__(*a, directory=str(root), **kw)

            def log_message(self, format: str, *args: Any) -> None:
                requests.append(self.path)

        self.server = http.server.ThreadingHTTPServer((address, 0), Handler)
        self.url = f"http://{address}:{self.server.server_address[1]}/simple"

    def start(self) -> LocalIndex:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
