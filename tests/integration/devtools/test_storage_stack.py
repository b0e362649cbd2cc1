"""`just up --data`'s storage servers together (gpufleet_devstack.storage.servers): started
at once on their fixed ports, the demo data put with the real clients and got back with
them, from each server; kept across a restart where the server keeps files."""

from __future__ import annotations

import ftplib
import io
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import boto3
import httpx
import pytest
from azure.storage.blob import BlobServiceClient
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage
from gpufleet_devstack.storage import demo
from gpufleet_devstack.storage.repos import GIT_ENV
from gpufleet_devstack.storage.servers import StorageServers, free_storage_ports


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[StorageServers]:
    servers = StorageServers(tmp_path / "storage", tmp_path / "logs", free_storage_ports())
    servers.start()
    try:
        yield servers
    finally:
        servers.stop()


def _fetched(servers: StorageServers, tmp_path: Path) -> dict[str, bytes]:
    """The dataset archive as each client gets it."""
    got: dict[str, bytes] = {}
    s3 = boto3.client("s3", **servers.s3.endpoint.boto3_kwargs())
    got["s3"] = s3.get_object(Bucket=demo.BUCKET, Key=demo.DATASET)["Body"].read()
    gcs = storage.Client(
        project=servers.gcs.endpoint.project,
        credentials=AnonymousCredentials(),
        client_options={"api_endpoint": servers.gcs.endpoint.url},
    )
    got["gcs"] = gcs.bucket(demo.BUCKET).blob(demo.DATASET).download_as_bytes()
    azure = servers.azure.endpoint
    blobs = BlobServiceClient.from_connection_string(
        azure.connection_string, connection_verify=str(azure.ca_file)
    )
    got["azure"] = blobs.get_blob_client(demo.BUCKET, demo.DATASET).download_blob().readall()
    context = ssl.create_default_context(cafile=servers.tls.ca)
    got["https"] = httpx.get(servers.web.url(demo.DATASET), verify=context).content
    with ftplib.FTP() as ftp:
        ftp.connect(servers.ftp.host, servers.ftp.port, timeout=10)
        ftp.login()
        data = io.BytesIO()
        ftp.retrbinary(f"RETR {demo.DATASET}", data.write)
        got["ftp"] = data.getvalue()
    for name, url in (
        ("git", servers.git.url(demo.MODEL_REPO)),
        ("git-http", servers.git_http.url(demo.MODEL_REPO)),
    ):
        work = tmp_path / name
        subprocess.run(
            ["git", "clone", "--quiet", url, str(work)],
            env=dict(GIT_ENV),
            check=True,
            timeout=60,
        )
        got[name] = (work / "train.py").read_bytes()
        subprocess.run(["rm", "-rf", str(work)], check=True)
    return got


def test_the_demo_data_is_served_by_every_server(servers: StorageServers, tmp_path: Path) -> None:
    servers.seed()
    archive = demo.dataset_archive()
    expected = {
        **dict.fromkeys(("s3", "gcs", "azure", "https", "ftp"), archive),
        **dict.fromkeys(("git", "git-http"), demo.TRAIN_PY.encode()),
    }
    assert _fetched(servers, tmp_path) == expected
    assert "endpoint: " + servers.s3.endpoint.url in servers.job_file.read_text()
    assert (servers.keys_dir / "azure.json").stat().st_mode & 0o077 == 0

    servers.stop()  # the next `just up --data`: the same ports, the data kept or put again
    servers.start()
    servers.seed()
    assert _fetched(servers, tmp_path) == expected
