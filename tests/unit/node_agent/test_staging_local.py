"""The node's `local` fetcher and uploader (staging/local.py) against a requester that
answers as the scheduler would and a real local http server as the relay's store: the node
waits, saying so, until the user has sent the mount's file, then unpacks it into the mount;
its output is put and must be verified; the presigned URL is in no reason and no log. The
real bus, MongoDB and S3: tests/integration/datastore/test_local_relay.py."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import tarfile
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from gpufleet_contracts.locations import LocalSource
from gpufleet_node_agent.settings import AgentSettings
from gpufleet_node_agent.staging.guard import AddressGuard
from gpufleet_node_agent.staging.local import LocalRelay
from gpufleet_node_agent.staging.node import node_staging
from gpufleet_node_agent.staging.platform import Platform
from gpufleet_node_agent.staging.registry import Moved, Transfer
from gpufleet_node_agent.steps.base import WorkerFailed

NODE = "node-1"
SECRET = "X-Amz-Signature=s3cr3t"
MOUNT = "/opt/ml/input"
WAITING = b'{"state": "waiting", "grant": null}'


def _tar() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in (("a.txt", b"alpha\n"), ("sub/b.txt", b"beta\n")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def staged(url: str, method: str, name: str, mount: str = MOUNT) -> bytes:
    expires = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    grant = {"mount": mount, "name": name, "method": method, "url": url, "expires_at": expires}
    return json.dumps({"state": "ready", "grant": grant}).encode()


class Scheduler:
    """Answers a node's requests as the scheduler would, and keeps them."""

    def __init__(self, *answers: bytes) -> None:
        self.answers = list(answers)
        self.asked: list[tuple[str, dict[str, Any]]] = []

    async def __call__(self, subject: str, body: bytes) -> bytes:
        self.asked.append((subject, json.loads(body)))
        return self.answers.pop(0)


@pytest.fixture
def store() -> Iterator[tuple[str, list[bytes]]]:
    """A local http server: GET answers a tar of two files, PUT keeps the body."""
    put: list[bytes] = []
    body = _tar()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_PUT(self) -> None:
            put.append(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", put
    server.shutdown()
    server.server_close()


def transfer(heard: list[Moved], mount: str | None = MOUNT) -> Transfer:
    def told(moved: Moved) -> None:
        heard.append(moved)

    return Transfer({}, 10**6, told, job_id="job-1", placement_id="p-1", worker=0, mount=mount)


async def test_the_node_waits_for_the_user_then_unpacks_what_was_sent(
    store: tuple[str, list[bytes]], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    base, _ = store
    url = f"{base}/local/job-1/opt_ml_input/0/data.tar?{SECRET}"
    asked = Scheduler(WAITING, WAITING, staged(url, "GET", "data.tar"))
    heard: list[Moved] = []
    relay = LocalRelay(Platform(NODE, asked, AddressGuard()), poll_s=0.01)
    await relay.fetch(LocalSource(path="~/data"), tmp_path, transfer(heard))
    assert (tmp_path / "a.txt").read_text() == "alpha\n"
    assert (tmp_path / "sub" / "b.txt").read_text() == "beta\n"
    assert heard[:2] == [Moved(0, None, waiting=True)] * 2
    assert heard[-1].done == heard[-1].total and not heard[-1].waiting
    assert [s for s, _ in asked.asked] == [
        f"gpufleet.v1.nrpc.scheduler.stage_local_data.{NODE}"
    ] * 3
    assert asked.asked[0][1] == {
        "job_id": "job-1",
        "placement_id": "p-1",
        "worker": 0,
        "mount": MOUNT,
        "mode": "read",
    }
    assert "s3cr3t" not in caplog.text


async def test_a_refusal_or_no_mount_fails_the_worker(tmp_path: Path) -> None:
    gone = b'{"ok": false, "error": {"code": "not_found", "message": "no placement"}}'
    relay = LocalRelay(Platform(NODE, Scheduler(gone), AddressGuard()), poll_s=0.01)
    with pytest.raises(WorkerFailed, match="local ~/data not found"):
        await relay.fetch(LocalSource(path="~/data"), tmp_path, transfer([]))
    with pytest.raises(WorkerFailed, match="no mount"):
        await relay.fetch(LocalSource(path="~/data"), tmp_path, transfer([], mount=None))


async def test_an_output_is_put_in_the_relay_and_must_be_verified(
    store: tuple[str, list[bytes]], tmp_path: Path
) -> None:
    base, put = store
    out = tmp_path / "fit.zip"
    out.write_bytes(b"z" * 3000)
    url = f"{base}/local/job-1/output/0/fit.zip?{SECRET}"
    view = {
        "account": "acct",
        "job_id": "job-1",
        "mount": "output",
        "name": "fit.zip",
        "state": "ready",
        "size": 3000,
        "sha256": "0" * 64,
        "created_at": "2030-01-01T00:00:00Z",
        "expires_at": "2030-01-08T00:00:00Z",
    }
    asked = Scheduler(staged(url, "PUT", "fit.zip", "output"), json.dumps(view).encode())
    relay = LocalRelay(Platform(NODE, asked, AddressGuard()))
    with pytest.raises(WorkerFailed, match="checksum differs"):
        await relay.put(out, LocalSource(path="~/out"), transfer([]))
    assert put == [b"z" * 3000]
    (_, stage), (subject, complete) = asked.asked
    assert (stage["mode"], stage["mount"]) == ("write", "output")
    assert subject == f"gpufleet.v1.nrpc.scheduler.complete_local_upload.{NODE}"
    assert complete == {"job_id": "job-1", "placement_id": "p-1", "worker": 0}
    good = {**view, "sha256": hashlib.sha256(b"z" * 3000).hexdigest()}
    asked = Scheduler(staged(url, "PUT", "fit.zip", "output"), json.dumps(good).encode())
    await LocalRelay(Platform(NODE, asked, AddressGuard())).put(
        out, LocalSource(path="~/out"), transfer([])
    )


def test_local_is_registered_only_with_a_bus(tmp_path: Path) -> None:
    settings = AgentSettings(minion_id=NODE, agent_state_dir=tmp_path)
    fetchers, uploaders = node_staging(settings)
    assert "local" not in fetchers.by_kind and "local" not in uploaders.by_kind
    fetchers, uploaders = node_staging(settings, Scheduler())
    assert "local" in fetchers.by_kind and "local" in uploaders.by_kind
