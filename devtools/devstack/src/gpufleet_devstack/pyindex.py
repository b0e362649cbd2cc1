"""A PEP 503 package index of wheels made on the spot, for tests of package builds (R-JOB-7):
served on the host's own non-loopback address, which a build container's slirp4netns reaches
(the host's loopback it does not). Nothing comes from PyPI."""

from __future__ import annotations

import base64
import hashlib
import http.server
import re
import shutil
import socket
import subprocess
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


def index_reachable(project: str = "jupyterlab") -> bool:
    """Can the host reach the package index (its pip would fetch from there)?"""
    try:
        with urllib.request.urlopen(f"https://pypi.org/simple/{project}/", timeout=10) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def _index_pages(root: Path) -> None:
    """`root/simple/<project>/index.html` for every wheel there (PEP 503)."""
    for project in (root / "simple").iterdir():
        links = "".join(f'<a href="{f.name}">{f.name}</a>\n' for f in sorted(project.glob("*.whl")))
        (project / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")


def downloaded(root: Path, requirement: str, python_version: str) -> Path | None:
    """A simple index under `root` of the wheels `requirement` installs on `python_version`
    (binary only), fetched by the host's pip with the host's certificates: a build container
    trusts Debian's CAs only, which a TLS-inspecting proxy in front of the index fails. None
    when the host has no pip."""
    pip = shutil.which("pip3") or shutil.which("pip")
    if pip is None:
        return None
    wheels = root / "wheels"
    wanted = ["--only-binary", ":all:", "--python-version", python_version, requirement]
    subprocess.run([pip, "download", "-q", "--dest", str(wheels), *wanted], check=True, timeout=600)
    for whl in wheels.glob("*.whl"):
        project = root / "simple" / re.sub(r"[-_.]+", "-", whl.name.split("-")[0]).lower()
        project.mkdir(parents=True, exist_ok=True)
        whl.rename(project / whl.name)
    _index_pages(root)
    return root


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
    _index_pages(dist)


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


def wheels_index(root: Path, requirement: str, python_version: str) -> LocalIndex | str:
    """A running index of the wheels `requirement` installs (`downloaded`), on the host's
    address a build container reaches; or why there can be none here."""
    address = host_address()
    if address is None:
        return "no address of the host's that a build container reaches"
    if not debian_reachable() or not index_reachable():
        return "deb.debian.org or the package index is not reachable"
    got = downloaded(root, requirement, python_version)
    if got is None:
        return "no pip on the host to fetch the wheels with"
    return LocalIndex(got, address).start()


def image_python(image: str, env: dict[str, str]) -> str:
    """The Python version of `image` (a wheel is chosen for it: bookworm's 3.11.2, and some
    releases want a later 3.11)."""
    code = "import platform; print(platform.python_version())"
    return subprocess.run(
        ["podman", "run", "--rm", "--network", "none", image, "python3", "-c", code],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
