"""`python -m gpufleet_endpoint relay`: a job's own server reached through a unix socket, its
signals passed on and its exit status kept."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from .test_process import free_port

RELAY = (sys.executable, "-m", "gpufleet_endpoint", "relay")


def wait_for_socket(sock: Path, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while not sock.exists():
        assert proc.poll() is None, "the relay ended before it listened"
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_a_servers_connections_are_relayed_and_its_end_is_the_relays(tmp_path: Path) -> None:
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "hello.txt").write_text("hello from port 80")
    sock, port = tmp_path / "http.sock", free_port()
    server = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    proc = subprocess.Popen(
        [*RELAY, "--uds", str(sock), "--to", f"127.0.0.1:{port}", "--", *server],
        cwd=tmp_path / "site",
    )
    try:
        wait_for_socket(sock, proc)
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://x") as c:
            deadline = time.monotonic() + 30
            while True:  # the child may not listen yet: the relay then closes the connection
                try:
                    r = c.get("/hello.txt")
                    break
                except httpx.TransportError:
                    assert time.monotonic() < deadline
                    time.sleep(0.1)
            assert (r.status_code, r.text) == (200, "hello from port 80")
            big = c.get("/", headers={"x-pad": "p" * 8000})  # more than one read's worth
            assert big.status_code == 200
        proc.send_signal(signal.SIGTERM)  # passed on: http.server dies of it
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        assert not sock.exists()
    finally:
        proc.kill()
        proc.wait()


def test_a_command_that_exits_ends_the_relay_with_its_status(tmp_path: Path) -> None:
    sock = tmp_path / "http.sock"
    done = subprocess.run(
        [*RELAY, "--uds", str(sock), "--", sys.executable, "-c", "print('daemonised'); exit(3)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout.strip()) == (3, "daemonised")
    assert not sock.exists()


def test_a_command_that_cannot_run_is_said(tmp_path: Path) -> None:
    done = subprocess.run(
        [*RELAY, "--uds", str(tmp_path / "s"), "--", str(tmp_path / "nothing-here")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 127 and "cannot run" in done.stderr
