"""The node's content cache (staging/cache.py) in front of the real fetchers: moto's S3 and
the web file server of gpufleet_devstack.storage, their GET requests counted in their logs."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from gpufleet_contracts.locations import S3Source, WebSource
from gpufleet_devstack.storage import S3Server, WebServer, running_s3, running_web
from gpufleet_node_agent.staging.cache import ContentCache
from gpufleet_node_agent.staging.guard import AddressGuard
from gpufleet_node_agent.staging.registry import Transfer
from gpufleet_node_agent.staging.s3 import S3
from gpufleet_node_agent.staging.web import Web
from gpufleet_node_agent.steps.base import WorkerFailed

LOCAL = AddressGuard.of(["127.0.0.0/8"])
MIB = 1024 * 1024


def gets(log: Path, path: str) -> int:
    """The GET requests of `path` the server logged."""
    return sum(1 for line in log.read_text(errors="replace").splitlines() if f"GET {path}" in line)


def transfer(keys: dict[str, Any] | None = None) -> Transfer:
    return Transfer(keys or {}, 64 * MIB, lambda moved: None)


def worker(tmp_path: Path, name: str, mount: str = "data") -> Path:
    d = tmp_path / "workers" / name / "mounts" / mount
    d.mkdir(parents=True)
    return d


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with running_s3(tmp_path_factory.mktemp("s3")) as server:
        boto3.client("s3", **server.endpoint.boto3_kwargs()).create_bucket(Bucket="cached")
        yield server


def _keys(server: S3Server) -> dict[str, Any]:
    e = server.endpoint
    return {"wasabi": {"access_key_id": e.access_key_id, "secret_access_key": e.secret_access_key}}


async def test_s3_a_second_fetch_transfers_nothing_a_new_etag_is_fetched_again(
    s3_server: S3Server, tmp_path: Path
) -> None:
    client = boto3.client("s3", **s3_server.endpoint.boto3_kwargs())
    client.put_object(Bucket="cached", Key="w.bin", Body=b"weights-1")
    client.put_object(Bucket="cached", Key="set/a.csv", Body=b"x,y\n")
    client.put_object(Bucket="cached", Key="set/sub/b.csv", Body=b"1,2\n")
    s3, cache = S3(LOCAL), ContentCache(tmp_path / "cache", 10 * MIB)
    fetch = cache.fetcher(s3.fetch, s3.version)
    url = s3_server.endpoint.url
    obj = S3Source(url="s3://cached/w.bin", endpoint=url)
    prefix = S3Source(url="s3://cached/set/", endpoint=url)
    log = s3_server.log_file
    for name in ("one", "two"):
        await fetch(obj, worker(tmp_path, name), transfer(_keys(s3_server)))
        await fetch(prefix, worker(tmp_path, name, "set"), transfer(_keys(s3_server)))
    assert gets(log, "/cached/w.bin") == 1
    assert gets(log, "/cached/set/a.csv") == 1 and gets(log, "/cached/set/sub/b.csv") == 1
    two = tmp_path / "workers" / "two" / "mounts"
    assert (two / "data" / "w.bin").read_bytes() == b"weights-1"
    assert (two / "set" / "sub" / "b.csv").read_bytes() == b"1,2\n"
    assert os.stat(two / "data" / "w.bin").st_mode & 0o777 == 0o444
    assert (cache.counts.hits, cache.counts.misses) == (2, 2)

    client.put_object(Bucket="cached", Key="w.bin", Body=b"weights-2")  # a new ETag
    three = worker(tmp_path, "three")
    await fetch(obj, three, transfer(_keys(s3_server)))
    assert (three / "w.bin").read_bytes() == b"weights-2"
    assert gets(log, "/cached/w.bin") == 2


async def test_s3_a_worker_without_the_key_gets_no_hit(s3_server: S3Server, tmp_path: Path) -> None:
    client = boto3.client("s3", **s3_server.endpoint.boto3_kwargs())
    client.put_object(Bucket="cached", Key="private.bin", Body=b"secret")
    s3, cache = S3(LOCAL), ContentCache(tmp_path / "cache", 10 * MIB)
    fetch = cache.fetcher(s3.fetch, s3.version)
    src = S3Source(url="s3://cached/private.bin", endpoint=s3_server.endpoint.url)
    await fetch(src, worker(tmp_path, "owner"), transfer(_keys(s3_server)))
    stranger = worker(tmp_path, "stranger")
    with pytest.raises(WorkerFailed, match=r"private\.bin is forbidden"):
        await fetch(src, stranger, transfer())  # no key: anonymous, refused by the source
    assert not any(stranger.iterdir())
    assert (cache.counts.hits, cache.counts.misses) == (0, 1)


@pytest.fixture(scope="module")
def web_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebServer]:
    root = tmp_path_factory.mktemp("www")
    (root / "model.bin").write_bytes(b"m" * 1000)
    with running_web(root) as server:
        yield server


async def test_web_a_second_fetch_is_a_head_and_a_changed_file_is_fetched_again(
    web_server: WebServer, tmp_path: Path
) -> None:
    web, cache = Web(LOCAL), ContentCache(tmp_path / "cache", 10 * MIB)
    fetch = cache.fetcher(web.fetch, web.version)
    src = WebSource(url=web_server.url("model.bin"))
    for name in ("one", "two"):
        await fetch(src, worker(tmp_path, name), transfer())
    assert gets(web_server.log_file, "/model.bin") == 1
    assert (tmp_path / "workers/two/mounts/data/model.bin").read_bytes() == b"m" * 1000
    # a new length (and Last-Modified): another version
    path = web_server.root / "model.bin"
    path.write_bytes(b"n" * 1001)
    os.utime(path, (path.stat().st_atime, path.stat().st_mtime + 5))
    four = worker(tmp_path, "four")
    await fetch(src, four, transfer())
    assert (four / "model.bin").read_bytes() == b"n" * 1001
    assert gets(web_server.log_file, "/model.bin") == 2
    assert cache.counts.hits == 1 and cache.counts.misses == 2
    with pytest.raises(WorkerFailed, match="not found"):
        await fetch(WebSource(url=web_server.url("none.bin")), four, transfer())
