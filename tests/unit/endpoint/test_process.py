"""`python -m gpufleet_endpoint` as the container runs it: a real uvicorn on a TCP port or a
unix socket, called with httpx."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from gpufleet_endpoint import HEALTH_PATH

from .conftest import route, write

MODULE = (sys.executable, "-m", "gpufleet_endpoint")
MODEL = {"m.py": "def add(a, b=1):\n    return a + b\n"}
ROUTES = [route("/add", "m.py", "add", ("a", "integer"), ("b", "integer", "1"))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def local(port: int | None = None) -> list[str]:
    return ["--host", "127.0.0.1", "--port", str(port or free_port())]


@contextmanager
def server(models: Path, *listen: str) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    routes_file = models.parent / "routes.json"
    routes_file.write_text(json.dumps(ROUTES))
    log = models.parent / "server.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [*MODULE, "--routes", str(routes_file), "--models", str(models), *listen],
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    try:
        yield proc, log
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def ready(client: httpx.Client, proc: subprocess.Popen[str], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()
        try:
            if client.get(HEALTH_PATH).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"not ready in 60 s: {log.read_text()}")


def test_the_module_serves_its_routes_on_a_port(models: Path) -> None:
    write(models, MODEL)
    port = free_port()
    with (
        server(models, *local(port)) as (proc, log),
        httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client,
    ):
        ready(client, proc, log)
        for _ in range(3):
            assert client.get(HEALTH_PATH).json() == {"status": "ok"}
        assert client.post("/add", json={"a": 2, "b": 40}).json() == 42
        assert client.post("/add", json={"a": 2}).json() == 3
        assert client.post("/add", json={"a": "2"}).status_code == 422
    text = log.read_text()
    assert '"POST /add HTTP/1.1" 200' in text and '"POST /add HTTP/1.1" 422' in text
    assert HEALTH_PATH not in text  # the readiness probes stay out of the job's log
    assert "Application shutdown complete" in text  # SIGTERM: a graceful stop


def test_the_module_serves_on_a_unix_socket(models: Path, tmp_path: Path) -> None:
    write(models, MODEL)
    uds = tmp_path / "endpoint.sock"
    transport = httpx.HTTPTransport(uds=str(uds))
    with (
        server(models, "--uds", str(uds)) as (proc, log),
        httpx.Client(transport=transport, base_url="http://endpoint", timeout=10) as client,
    ):
        ready(client, proc, log)
        assert client.post("/add", json={"a": 1, "b": 1}).json() == 2


def test_the_module_exits_1_when_it_cannot_start(models: Path) -> None:
    write(models.parent, {"evil.py": "def add(a, b):\n    pass\n"})
    routes_file = models.parent / "routes.json"
    routes_file.write_text(json.dumps([dict(ROUTES[0], file="../evil.py")]))
    done = subprocess.run(
        [*MODULE, "--routes", str(routes_file), "--models", str(models), *local()],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "gpufleet_endpoint: cannot start: route file '../evil.py'" in done.stderr
