"""The node's `platform` fetcher and uploader (staging/platform.py) against a requester that
answers as the scheduler would and a real local http server as the store: the node's own
subject and placement in each request, the store reached only at the granted host:port
(never a metadata or link-local address), the scheduler's refusals as reasons, an upload
the datastore does not verify failing the worker, and the presigned URL in no reason and no
log. The real bus, MongoDB and S3: tests/integration/datastore/test_platform_staging.py."""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import nats.errors
import pytest
from gpufleet_contracts.locations import PlatformAsset, PlatformRef
from gpufleet_node_agent.settings import AgentSettings
from gpufleet_node_agent.staging.guard import AddressGuard
from gpufleet_node_agent.staging.node import node_staging
from gpufleet_node_agent.staging.platform import Platform, StoreGuard
from gpufleet_node_agent.staging.registry import Moved, Transfer
from gpufleet_node_agent.steps.base import WorkerFailed

NODE = "node-1"
SECRET = "X-Amz-Signature=s3cr3t"
DATASET = PlatformRef(asset=PlatformAsset.dataset, name="corpus")
MODEL = PlatformRef(asset=PlatformAsset.model)


def _unheard(moved: Moved) -> None:
    pass


def transfer(limit: int = 10**6) -> Transfer:
    return Transfer({}, limit, _unheard, job_id="job-1", placement_id="p-1", worker=2)


def grant(url: str, method: str = "GET") -> bytes:
    expires = datetime.now(UTC) + timedelta(hours=1)
    body = {"account": "acct", "asset": "dataset", "name": "corpus", "method": method}
    return json.dumps({**body, "url": url, "expires_at": expires.isoformat()}).encode()


class Scheduler:
    """Answers a node's requests as the scheduler would, and keeps them."""

    def __init__(self, *answers: bytes | Exception) -> None:
        self.answers = list(answers)
        self.asked: list[tuple[str, dict[str, Any]]] = []

    async def __call__(self, subject: str, body: bytes) -> bytes:
        self.asked.append((subject, json.loads(body)))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


@pytest.fixture
def store() -> Iterator[tuple[str, list[bytes]]]:
    """A local http server: GET answers 5000 bytes, PUT keeps the body."""
    put: list[bytes] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "5000")
            self.end_headers()
            self.wfile.write(b"x" * 5000)

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


async def test_a_file_is_fetched_from_the_granted_store_only(
    store: tuple[str, list[bytes]], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    base, _ = store
    asked = Scheduler(grant(f"{base}/platform/acct/dataset/weights.bin?{SECRET}"))
    await Platform(NODE, asked, AddressGuard()).fetch(DATASET, tmp_path, transfer())
    # not an archive: kept under the object's name
    assert os.listdir(tmp_path) == ["corpus"]
    assert (tmp_path / "corpus").read_bytes() == b"x" * 5000
    subject, body = asked.asked[0]
    assert subject == f"gpufleet.v1.nrpc.scheduler.stage_platform_object.{NODE}"
    assert body["job_id"] == "job-1" and body["placement_id"] == "p-1"
    assert (body["worker"], body["asset"], body["name"], body["mode"]) == (
        2,
        "dataset",
        "corpus",
        "read",
    )
    # within the bytes left, and the URL nowhere
    again = Scheduler(grant(f"{base}/platform/acct/dataset/weights.bin?{SECRET}"))
    with pytest.raises(WorkerFailed) as large:
        await Platform(NODE, again, AddressGuard()).fetch(DATASET, tmp_path, transfer(4999))
    assert large.value.reason.startswith("dataset corpus is too large")
    assert "s3cr3t" not in caplog.text + large.value.reason


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/platform/x.zip",  # the metadata service, even when allowed
        "http://[fd00:ec2::254]/platform/x.zip",
        "http://0.0.0.0:9000/platform/x.zip",
        "ftp://store.example/platform/x.zip",
    ],
)
async def test_a_grant_never_reaches_metadata_or_another_scheme(url: str, tmp_path: Path) -> None:
    asked = Scheduler(grant(f"{url}?{SECRET}"))
    node = Platform(NODE, asked, AddressGuard.of(["169.254.0.0/16", "fd00::/8"]))
    with pytest.raises(WorkerFailed) as refused:
        await node.fetch(DATASET, tmp_path, transfer())
    assert "refused address" in refused.value.reason or "not http(s)" in refused.value.reason
    assert "s3cr3t" not in refused.value.reason


def test_the_store_guard_allows_only_its_pair() -> None:
    import ipaddress

    guard = StoreGuard(("127.0.0.1:9000",))
    assert str(guard.check("127.0.0.1", 9000, [ipaddress.ip_address("127.0.0.1")])) == "127.0.0.1"
    with pytest.raises(WorkerFailed, match="loopback"):
        guard.check("127.0.0.1", 9001, [ipaddress.ip_address("127.0.0.1")])
    with pytest.raises(WorkerFailed, match="link-local"):
        StoreGuard(("169.254.169.254:80",)).check(
            "169.254.169.254", 80, [ipaddress.ip_address("169.254.169.254")]
        )


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (
            b'{"ok": false, "error": {"code": "not_found", "message": "x"}}',
            "dataset corpus not found",
        ),
        (
            b'{"ok": false, "error": {"code": "forbidden", "message": "no"}}',
            "dataset corpus: refused (forbidden: no)",
        ),
        (nats.errors.TimeoutError(), "dataset corpus: the control plane did not answer"),
        (nats.errors.NoRespondersError(), "dataset corpus: the control plane did not answer"),
        (b"[]", "dataset corpus: the control plane's answer is unreadable"),
    ],
)
async def test_the_schedulers_refusals_are_reasons(
    answer: bytes | Exception, reason: str, tmp_path: Path
) -> None:
    node = Platform(NODE, Scheduler(answer), AddressGuard())
    with pytest.raises(WorkerFailed) as failed:
        await node.fetch(DATASET, tmp_path, transfer())
    assert failed.value.reason == reason


async def test_an_output_is_put_and_must_be_verified(
    store: tuple[str, list[bytes]], tmp_path: Path
) -> None:
    base, put = store
    out = tmp_path / "train.zip"
    out.write_bytes(b"z" * 3000)
    url = f"{base}/platform/acct/model/k.zip?{SECRET}"
    refused = b'{"ok": false, "error": {"code": "invalid", "message": "nothing was put"}}'
    asked = Scheduler(grant(url, "PUT"), refused)
    with pytest.raises(WorkerFailed) as failed:
        await Platform(NODE, asked, AddressGuard()).put(out, MODEL, transfer())
    assert failed.value.reason == "model corpus: upload not verified (invalid: nothing was put)"
    assert put == [b"z" * 3000]
    (_, stage), (subject, complete) = asked.asked
    assert (stage["mode"], stage["name"], stage["asset"]) == ("write", None, "model")
    assert subject == f"gpufleet.v1.nrpc.scheduler.complete_platform_upload.{NODE}"
    assert complete == {
        "job_id": "job-1",
        "placement_id": "p-1",
        "worker": 2,
        "asset": "model",
        "name": "corpus",
    }
    # the store holding other bytes than were sent
    view = {
        "account": "acct",
        "asset": "model",
        "name": "corpus",
        "state": "ready",
        "size": 3000,
        "sha256": "0" * 64,
        "created_at": "2030-01-01T00:00:00Z",
    }
    asked = Scheduler(grant(url, "PUT"), json.dumps(view).encode())
    with pytest.raises(WorkerFailed, match="upload not verified"):
        await Platform(NODE, asked, AddressGuard()).put(out, MODEL, transfer())


def test_platform_is_registered_only_with_a_bus(tmp_path: Path) -> None:
    settings = AgentSettings(minion_id=NODE, agent_state_dir=tmp_path)
    fetchers, uploaders = node_staging(settings)
    assert "platform" not in fetchers.by_kind and "platform" not in uploaders.by_kind
    fetchers, uploaders = node_staging(settings, Scheduler())
    assert "platform" in fetchers.by_kind and "platform" in uploaders.by_kind
    assert logging.getLogger("httpx").getEffectiveLevel() >= logging.WARNING
