"""The storage servers of the tests and `just up --data` (gpufleet_devstack.storage), each
spoken to by the real client a node stages with: an object put, then got back."""

from __future__ import annotations

import ftplib
import io
import os
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import boto3
import httpx
import pytest
from azure.core.exceptions import HttpResponseError
from azure.storage.blob import BlobServiceClient
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage
from gpufleet_devstack.storage import (
    LocalTls,
    bare_repo,
    local_tls,
    running_azurite,
    running_ftp,
    running_gcs,
    running_git_daemon,
    running_git_http,
    running_s3,
    running_web,
)
from gpufleet_devstack.storage.repos import GIT_ENV

# Past the clients' single-request sizes: S3 multipart (8 MiB parts), a resumable GCS
# upload in 8 MiB chunks.
BIG = 20 * 1024 * 1024


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> LocalTls:
    return local_tls(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def payload() -> bytes:
    return os.urandom(BIG)


def test_s3_put_and_get_with_boto3(tmp_path: Path, payload: bytes) -> None:
    with running_s3(tmp_path / "s3") as server:
        s3 = boto3.client("s3", **server.endpoint.boto3_kwargs())
        s3.create_bucket(Bucket="demo")
        s3.put_object(Bucket="demo", Key="data/a.csv", Body=b"x,y\n1,2\n")
        assert s3.get_object(Bucket="demo", Key="data/a.csv")["Body"].read() == b"x,y\n1,2\n"
        s3.upload_fileobj(io.BytesIO(payload), "demo", "big.bin")  # multipart
        got = io.BytesIO()
        s3.download_fileobj("demo", "big.bin", got)
        assert got.getvalue() == payload
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket="demo")["Contents"]]
        assert keys == ["big.bin", "data/a.csv"]


def test_gcs_put_and_get_with_google_cloud_storage(tmp_path: Path, payload: bytes) -> None:
    with running_gcs(tmp_path / "gcs") as server:
        endpoint = server.endpoint
        client = storage.Client(
            project=endpoint.project,
            credentials=AnonymousCredentials(),
            client_options={"api_endpoint": endpoint.url},
        )
        bucket = client.create_bucket("demo")
        bucket.blob("data/a.csv").upload_from_string(b"x,y\n1,2\n")
        assert client.bucket("demo").blob("data/a.csv").download_as_bytes() == b"x,y\n1,2\n"
        big = bucket.blob("big.bin", chunk_size=8 * 1024 * 1024)  # a resumable upload
        big.upload_from_file(io.BytesIO(payload))
        assert client.bucket("demo").blob("big.bin").download_as_bytes() == payload
        assert sorted(b.name for b in client.list_blobs("demo")) == ["big.bin", "data/a.csv"]
        server.restart()  # its objects are files under its root
        assert client.bucket("demo").blob("data/a.csv").download_as_bytes() == b"x,y\n1,2\n"


def test_azure_put_and_get_with_azure_storage_blob_over_https(
    tmp_path: Path, tls: LocalTls, payload: bytes
) -> None:
    with running_azurite(tmp_path / "azurite", tls=tls) as server:
        endpoint = server.endpoint
        assert endpoint.account_url.startswith("https://")  # what an `azure` path must be
        service = BlobServiceClient(
            endpoint.account_url,
            credential={"account_name": endpoint.account_name, "account_key": endpoint.account_key},
            connection_verify=str(endpoint.ca_file),
            max_single_put_size=4 * 1024 * 1024,  # a bigger blob goes in blocks
        )
        container = service.create_container("demo")
        container.upload_blob("data/a.csv", b"x,y\n1,2\n")
        assert container.download_blob("data/a.csv").readall() == b"x,y\n1,2\n"
        container.upload_blob("big.bin", payload)
        assert container.download_blob("big.bin", max_concurrency=2).readall() == payload
        assert sorted(container.list_blob_names()) == ["big.bin", "data/a.csv"]
        server.restart()
        assert container.download_blob("data/a.csv").readall() == b"x,y\n1,2\n"


def test_azure_refuses_a_wrong_key(tmp_path: Path) -> None:
    with running_azurite(tmp_path / "azurite") as server:
        endpoint = server.endpoint
        assert endpoint.account_url.startswith("http://")
        wrong = BlobServiceClient.from_connection_string(
            endpoint.connection_string.replace(endpoint.account_key, "d3Jvbmc=")
        )
        with pytest.raises(HttpResponseError, match="AuthorizationFailure"):
            wrong.create_container("demo")


def _git(*args: str, cwd: Path | None = None) -> str:
    done = subprocess.run(
        ["git", *args], cwd=cwd, env=dict(GIT_ENV), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def repos(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "git"
    bare_repo(root, "model.git", {"train.py": "print('trained')\n", "conf/a.yaml": "a: 1\n"})
    yield root


def _clone_push_clone(url: str, work: Path) -> None:
    """Clone `url`, push a commit to it, and see the commit in a second clone."""
    _git("clone", "--quiet", url, str(work / "one"))
    assert (work / "one" / "train.py").read_text() == "print('trained')\n"
    (work / "one" / "weights.bin").write_bytes(os.urandom(2 * 1024 * 1024))  # > postBuffer
    _git("add", "weights.bin", cwd=work / "one")
    _git("commit", "--quiet", "-m", "weights", cwd=work / "one")
    _git("push", "--quiet", "origin", "main", cwd=work / "one")
    _git("clone", "--quiet", "--depth=1", url, str(work / "two"))
    pushed = (work / "one" / "weights.bin").read_bytes()
    assert (work / "two" / "weights.bin").read_bytes() == pushed
    assert _git("log", "--format=%s", cwd=work / "two").split() == ["weights"]


def test_git_daemon_clone_and_push_over_git_protocol(repos: Path, tmp_path: Path) -> None:
    with running_git_daemon(repos) as server:
        assert server.url("model.git").startswith("git://127.0.0.1:")
        _clone_push_clone(server.url("model.git"), tmp_path / "work")


def test_git_http_clone_and_push_over_http(repos: Path, tmp_path: Path) -> None:
    with running_git_http(repos) as server:
        assert server.url("model.git").startswith("http://127.0.0.1:")
        _clone_push_clone(server.url("model.git"), tmp_path / "work")
        for protocol in ("1", "2"):  # the smart protocol's two versions
            out = _git("-c", f"protocol.version={protocol}", "ls-remote", server.url("model.git"))
            assert "refs/heads/main" in out
        missing = subprocess.run(
            ["git", "ls-remote", server.url("nothing.git")], env=dict(GIT_ENV), capture_output=True
        )
        assert missing.returncode != 0


@pytest.mark.parametrize("https", [False, True], ids=["http", "https"])
def test_web_put_and_get_with_httpx(
    tmp_path: Path, tls: LocalTls, payload: bytes, https: bool
) -> None:
    with running_web(tmp_path / "www", tls=tls if https else None) as server:
        verify = ssl.create_default_context(cafile=server.ca_file) if https else True
        with httpx.Client(verify=verify, timeout=30) as client:
            put = client.put(server.url("data/big.bin"), content=payload)
            assert put.status_code == 201
            got = client.get(server.url("data/big.bin"))
            assert got.status_code == 200 and got.content == payload
            assert client.get(server.url("data/none.bin")).status_code == 404
            escape = client.put(server.url() + "%2e%2e/escape.bin", content=b"x")
            assert escape.status_code == 403
        assert not (tmp_path / "escape.bin").exists()
        if https:  # a client that was not told the CA refuses the server
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                httpx.get(server.url("data/big.bin"))


def test_ftp_put_and_get_with_ftplib(tmp_path: Path, payload: bytes) -> None:
    with running_ftp(tmp_path / "ftp") as server:
        endpoint = server.endpoint
        with ftplib.FTP() as ftp:
            ftp.connect(endpoint.host, endpoint.port, timeout=10)
            ftp.login(endpoint.user, endpoint.password)
            ftp.mkd("data")
            ftp.storbinary("STOR data/big.bin", io.BytesIO(payload))
        with ftplib.FTP() as anonymous:  # what a `web` input's ftp:// URL logs in as
            anonymous.connect(endpoint.host, endpoint.port, timeout=10)
            anonymous.login()
            got = io.BytesIO()
            anonymous.retrbinary("RETR data/big.bin", got.write)
            assert got.getvalue() == payload
            with pytest.raises(ftplib.error_perm):
                anonymous.storbinary("STOR data/nope.bin", io.BytesIO(b"x"))
        with ftplib.FTP() as wrong:
            wrong.connect(endpoint.host, endpoint.port, timeout=10)
            with pytest.raises(ftplib.error_perm):
                wrong.login(endpoint.user, "wrong")
