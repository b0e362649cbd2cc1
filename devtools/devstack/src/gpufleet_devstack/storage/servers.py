"""`just up --data`: the storage servers on fixed ports (from one base port, so that a job
file written today works tomorrow), their demo data, and what the node agent and the
user are told about them. Data under `root` (`.run/storage`), logs in `log_dir`."""

from __future__ import annotations

import contextlib
import json
import random
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from gpufleet_auth import write_secret

from gpufleet_devstack._server import ServerProcess
from gpufleet_devstack.processes import DevstackError, port_in_use
from gpufleet_devstack.storage import demo
from gpufleet_devstack.storage.azurite import AzuriteBlob
from gpufleet_devstack.storage.ftp import FtpServer
from gpufleet_devstack.storage.gcs import GcsServer
from gpufleet_devstack.storage.git_daemon import GitDaemon
from gpufleet_devstack.storage.git_http import GitHttp
from gpufleet_devstack.storage.repos import bare_repo
from gpufleet_devstack.storage.s3 import S3Server
from gpufleet_devstack.storage.tls import local_tls
from gpufleet_devstack.storage.web import WebServer

__all__ = ["StoragePorts", "StorageServers", "free_storage_ports"]

PASSIVE_FROM, PASSIVE_TO = 10, 19  # FTP's data connections: base + 10 .. base + 19
PLATFORM_BUCKET = "gpufleet-platform"  # the datastore's platform objects (--data)


@dataclass(frozen=True)
class StoragePorts:
    """The servers' ports: base (S3), base + 1 (GCS), ... base + 6 (FTP), and FTP's
    passive ports."""

    base: int

    @property
    def named(self) -> dict[str, int]:
        names = ("s3", "gcs", "azure", "git", "git-http", "web", "ftp")
        return {name: self.base + i for i, name in enumerate(names)}

    @property
    def passive(self) -> tuple[int, int]:
        return self.base + PASSIVE_FROM, self.base + PASSIVE_TO

    def all(self) -> list[int]:
        low, high = self.passive
        return [*self.named.values(), *range(low, high + 1)]


def free_storage_ports(tries: int = 50) -> StoragePorts:
    """A block of free ports for a second set of storage servers (tests): below the kernel's
    ephemeral range, where the outgoing connections of the servers starting beside them
    (which take any ephemeral port) cannot take one of the block between this check and
    their bind."""
    low, _ = _ephemeral_range()
    block = PASSIVE_TO + 1
    rng = random.Random()
    for _ in range(tries):
        ports = StoragePorts(rng.randrange(20000, low - block))
        if not any(port_in_use(p) for p in ports.all()):
            return ports
    raise DevstackError(f"no {block} consecutive free ports below {low}")


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


class StorageServers:
    """The seven servers: S3, GCS, Azure Blob (https), git:// and git over http, files over
    https, FTP; the files served over https and FTP are the same. Made here (kept while
    valid): the CA and certificate of the https ones, under `root/tls`."""

    def __init__(self, root: Path, log_dir: Path, ports: StoragePorts) -> None:
        self.root = root
        self.ports = ports
        port = ports.named
        self.tls = local_tls(root / "tls")
        self.s3 = S3Server(root / "s3", port["s3"], log_file=log_dir / "s3.log")
        self.gcs = GcsServer(root / "gcs", port["gcs"], log_file=log_dir / "gcs.log")
        self.azure = AzuriteBlob(
            root / "azurite", port["azure"], tls=self.tls, log_file=log_dir / "azurite.log"
        )
        self.git = GitDaemon(root / "git", port["git"], log_file=log_dir / "git-daemon.log")
        self.git_http = GitHttp(root / "git", port["git-http"], log_file=log_dir / "git-http.log")
        self.web = WebServer(
            root / "files", port["web"], tls=self.tls, log_file=log_dir / "web.log"
        )
        self.ftp = FtpServer(
            root / "files", port["ftp"], passive=ports.passive, log_file=log_dir / "ftp.log"
        )
        self.job_file = root / "demo-job.yaml"
        self.endpoint_file = root / "demo-endpoint.yaml"
        self.keys_dir = root / "keys"

    @property
    def servers(self) -> list[ServerProcess]:
        return [self.s3, self.gcs, self.azure, self.git, self.git_http, self.web, self.ftp]

    def start(self) -> None:
        """Start them all at once (each waits for its own readiness); if one fails, stop
        the others and say which."""

        def start(server: ServerProcess) -> str | None:
            try:
                server.start()
            except (DevstackError, OSError) as exc:
                return f"{server.kind}: {exc}"
            return None

        with ThreadPoolExecutor(len(self.servers)) as pool:
            failed = [f for f in pool.map(start, self.servers) if f is not None]
        if failed:
            self.stop()
            raise DevstackError("storage servers did not start:\n" + "\n".join(failed))

    def stop(self) -> None:
        for server in reversed(self.servers):
            server.stop()

    @property
    def allowed(self) -> list[str]:
        """Their host:port, for the node agent's staging allow-list."""
        return [f"{server.host}:{server.port}" for server in self.servers]

    def agent_env(self) -> dict[str, str]:
        """What the node agent is told: the endpoints it may stage from and to (an
        operator's allow-list against SSRF), the CA of the https ones, and the GCS
        emulator (reached without a key)."""
        return {
            "GPUFLEET_STAGING_ALLOW": ",".join(self.allowed),
            "GPUFLEET_STAGING_CA_FILE": str(self.tls.ca),
            "GPUFLEET_STAGING_GCS_ENDPOINT": self.gcs.endpoint.url,
        }

    def platform_env(self) -> dict[str, str]:
        """What the datastore is told: its bucket of platform objects in the S3 server, made
        by the datastore at its start (services/datastore/README.md)."""
        s3 = self.s3.endpoint
        return {
            "GPUFLEET_PLATFORM_S3_ENDPOINT": s3.url,
            "GPUFLEET_PLATFORM_BUCKET": PLATFORM_BUCKET,
            "GPUFLEET_PLATFORM_ACCESS_KEY_ID": s3.access_key_id,
            "GPUFLEET_PLATFORM_SECRET_ACCESS_KEY": s3.secret_access_key,
            "GPUFLEET_PLATFORM_REGION": s3.region,
            "GPUFLEET_PLATFORM_CREATE_BUCKET": "1",
        }

    def seed(self) -> None:
        """The demo data, put with the real clients: the dataset archive in the S3 and GCS
        buckets and the Azure container `demo` and among the served files; the model
        repository; the demo job's and the demo endpoint's files, and the keys the job names
        (`gpufleet key add`)."""
        archive = demo.dataset_archive()
        self._seed_s3(archive)
        self._seed_gcs(archive)
        self._seed_azure(archive)
        (self.web.root / demo.DATASET).write_bytes(archive)
        bare_repo(self.git.root, demo.MODEL_REPO, demo.MODEL_FILES, "the demo model")
        self.job_file.write_text(
            demo.job_yaml(
                self.s3.endpoint.url,
                self.git_http.url(demo.MODEL_REPO),
                self.azure.endpoint.account_url,
            )
        )
        self.endpoint_file.write_text(demo.endpoint_yaml(self.git_http.url(demo.MODEL_REPO)))
        s3, azure = self.s3.endpoint, self.azure.endpoint
        keys = {
            "wasabi": {
                "access_key_id": s3.access_key_id,
                "secret_access_key": s3.secret_access_key,
                "region": s3.region,
            },
            "azure": {"account_name": azure.account_name, "account_key": azure.account_key},
        }
        for kind, fields in keys.items():
            write_secret(self.keys_dir / f"{kind}.json", json.dumps(fields) + "\n")

    def seed_platform(self, mongo_url: str, account: str, db: str = "gpufleet_datastore") -> None:
        """The demo checkpoint as a ready platform object of `account` (the datastore's
        record in `db` and its bytes in the platform bucket), as a job's output would have
        left it; again at each start (the same record, the same bytes). MongoDB must be up."""
        import hashlib
        from datetime import UTC, datetime

        import boto3
        from gpufleet_datastore.objects import COLLECTION
        from pymongo import MongoClient

        data = demo.checkpoint_archive()
        key = f"platform/{account}/checkpoint/{demo.CHECKPOINT}.zip"
        s3 = boto3.client("s3", **self.s3.endpoint.boto3_kwargs())
        s3.create_bucket(Bucket=PLATFORM_BUCKET)  # moto: again is fine (us-east-1)
        s3.put_object(Bucket=PLATFORM_BUCKET, Key=key, Body=data)
        now = datetime.now(UTC)
        record = {
            "key": key,
            "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "state": "ready",
            "public": False,
            "job_id": None,
            "worker": 0,
            "ready_at": now,
        }
        named = {"account": account, "asset": "checkpoint", "name": demo.CHECKPOINT}
        client: MongoClient[dict[str, object]] = MongoClient(
            mongo_url, serverSelectionTimeoutMS=5000
        )
        try:
            client[db][COLLECTION].update_one(
                named,
                {"$set": record, "$setOnInsert": {"_id": f"demo-{account}", "created_at": now}},
                upsert=True,
            )
        finally:
            client.close()

    def _seed_s3(self, archive: bytes) -> None:
        import boto3

        s3 = boto3.client("s3", **self.s3.endpoint.boto3_kwargs())
        s3.create_bucket(Bucket=demo.BUCKET)  # moto: again is fine (us-east-1)
        s3.put_object(Bucket=demo.BUCKET, Key=demo.DATASET, Body=archive)

    def _seed_gcs(self, archive: bytes) -> None:
        from google.auth.credentials import AnonymousCredentials
        from google.cloud.storage import Client

        endpoint = self.gcs.endpoint
        client = Client(
            project=endpoint.project,
            credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
            client_options={"api_endpoint": endpoint.url},
        )
        bucket = client.lookup_bucket(demo.BUCKET) or client.create_bucket(demo.BUCKET)
        bucket.blob(demo.DATASET).upload_from_string(archive)

    def _seed_azure(self, archive: bytes) -> None:
        from azure.core.exceptions import ResourceExistsError
        from azure.storage.blob import BlobServiceClient

        endpoint = self.azure.endpoint
        service = BlobServiceClient(
            endpoint.account_url,
            credential={"account_name": endpoint.account_name, "account_key": endpoint.account_key},
            connection_verify=str(endpoint.ca_file),
        )
        container = service.get_container_client(demo.BUCKET)
        with contextlib.suppress(ResourceExistsError):
            container.create_container()
        container.upload_blob(demo.DATASET, archive, overwrite=True)
