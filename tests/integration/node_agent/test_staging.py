"""The node's staging (staging/) against the real servers of gpufleet_devstack.storage, each
spoken to by the client a node fetches with: S3 (moto), GCS (the emulator), Azure Blob
(Azurite over https with its CA), files over https, FTP and FTPS, git over http and over ssh
(sshd, with the worker's key). One server of each per module."""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from azure.storage.blob import BlobServiceClient
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage
from gpufleet_contracts.locations import AzureSource, GcsSource, GitSource, S3Source, WebSource
from gpufleet_devstack.storage import (
    AzuriteBlob,
    FtpServer,
    GcsServer,
    GitHttp,
    GitSsh,
    LocalTls,
    S3Server,
    WebServer,
    bare_repo,
    local_tls,
    running_azurite,
    running_ftp,
    running_gcs,
    running_git_http,
    running_git_ssh,
    running_s3,
    running_web,
)
from gpufleet_devstack.storage.repos import GIT_ENV
from gpufleet_node_agent.staging.azure import Azure
from gpufleet_node_agent.staging.gcs import Gcs
from gpufleet_node_agent.staging.git import Git
from gpufleet_node_agent.staging.guard import AddressGuard
from gpufleet_node_agent.staging.registry import Moved, Transfer
from gpufleet_node_agent.staging.s3 import S3
from gpufleet_node_agent.staging.web import Web
from gpufleet_node_agent.steps import keys as keyfiles
from gpufleet_node_agent.steps.base import WorkerFailed
from gpufleet_node_agent.worker.files import write_json_atomic

LOCAL = AddressGuard.of(["127.0.0.0/8"])  # what `just up --data` allows, as a network
MIB = 1024 * 1024


def _tgz(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _zip(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return out.getvalue()


class Heard:
    def __init__(self) -> None:
        self.moved: list[Moved] = []

    def __call__(self, moved: Moved) -> None:
        self.moved.append(moved)


def transfer(keys: dict[str, Any] | None = None, limit: int = 64 * MIB, **kw: Any) -> Transfer:
    return Transfer(keys or {}, limit, Heard(), **kw)


def files(d: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(d)): p.read_bytes()
        for p in sorted(d.rglob("*"))
        if p.is_file() and ".git" not in p.parts
    }


@pytest.fixture
def dest(tmp_path: Path) -> Path:
    d = tmp_path / "mnt" / "opt" / "ml" / "input"
    d.mkdir(parents=True)
    return d


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> LocalTls:
    return local_tls(tmp_path_factory.mktemp("tls"))


# --- S3 ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with running_s3(tmp_path_factory.mktemp("s3")) as server:
        s3 = boto3.client("s3", **server.endpoint.boto3_kwargs())
        s3.create_bucket(Bucket="demo")
        s3.put_object(Bucket="demo", Key="sets/coco.tar.gz", Body=_tgz({"img/a.jpg": b"A"}))
        s3.put_object(Bucket="demo", Key="data/a.csv", Body=b"x,y\n")
        s3.put_object(Bucket="demo", Key="data/sub/b.csv", Body=b"1,2\n")
        yield server


def _wasabi(server: S3Server) -> dict[str, Any]:
    e = server.endpoint
    return {"wasabi": {"access_key_id": e.access_key_id, "secret_access_key": e.secret_access_key}}


async def test_s3_an_archive_object_is_unpacked_and_a_prefix_synced(
    s3_server: S3Server, dest: Path, tmp_path: Path
) -> None:
    s3 = S3(LOCAL)
    url = s3_server.endpoint.url
    t = transfer(_wasabi(s3_server))
    await s3.fetch(S3Source(url="s3://demo/sets/coco.tar.gz", endpoint=url), dest, t)
    assert files(dest) == {"img/a.jpg": b"A"}
    synced = tmp_path / "synced"
    synced.mkdir()
    await s3.fetch(S3Source(url="s3://demo/data/", endpoint=url), synced, t)
    assert files(synced) == {"a.csv": b"x,y\n", "sub/b.csv": b"1,2\n"}
    assert t.progress.moved[-1] == Moved(8, 8)  # type: ignore[attr-defined]


async def test_s3_put_is_read_back_single_and_multipart(
    s3_server: S3Server, tmp_path: Path
) -> None:
    s3 = S3(LOCAL)
    url = s3_server.endpoint.url
    small, big = tmp_path / "job.zip", tmp_path / "big.zip"
    small.write_bytes(b"output")
    big.write_bytes(bytes(range(256)) * (12 * 4096))  # > one 8 MiB part
    for path in (small, big):
        await s3.put(
            path, S3Source(url="s3://demo/out/", endpoint=url), transfer(_wasabi(s3_server))
        )
        got = boto3.client("s3", **s3_server.endpoint.boto3_kwargs()).get_object(
            Bucket="demo", Key=f"out/{path.name}"
        )
        assert got["Body"].read() == path.read_bytes()


async def test_s3_missing_too_large_and_refused(s3_server: S3Server, dest: Path) -> None:
    url = s3_server.endpoint.url
    with pytest.raises(WorkerFailed, match=r"^s3://demo/none\.zip not found$"):
        await S3(LOCAL).fetch(
            S3Source(url="s3://demo/none.zip", endpoint=url), dest, transfer(_wasabi(s3_server))
        )
    with pytest.raises(WorkerFailed, match="s3://demo/data/ is too large"):
        await S3(LOCAL).fetch(
            S3Source(url="s3://demo/data/", endpoint=url),
            dest,
            transfer(_wasabi(s3_server), limit=5),
        )
    with pytest.raises(WorkerFailed, match=r"refused address 127\.0\.0\.1: loopback"):
        await S3(AddressGuard()).fetch(
            S3Source(url="s3://demo/data/", endpoint=url), dest, transfer(_wasabi(s3_server))
        )
    assert not any(os.scandir(dest))


# --- GCS --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gcs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GcsServer]:
    with running_gcs(tmp_path_factory.mktemp("gcs")) as server:
        client = storage.Client(
            project=server.endpoint.project,
            credentials=AnonymousCredentials(),
            client_options={"api_endpoint": server.endpoint.url},
        )
        bucket = client.create_bucket("demo")
        bucket.blob("sets/coco.zip").upload_from_string(_zip({"img/a.jpg": b"A"}))
        bucket.blob("model/w.bin").upload_from_string(b"weights")
        yield server


async def test_gcs_fetch_unpacks_places_and_put_is_verified(
    gcs_server: GcsServer, dest: Path, tmp_path: Path
) -> None:
    gcs = Gcs(LOCAL, gcs_server.endpoint.url)
    await gcs.fetch(GcsSource(url="gs://demo/sets/coco.zip"), dest, transfer())
    await gcs.fetch(GcsSource(url="gs://demo/model/w.bin"), dest, transfer())
    assert files(dest) == {"img/a.jpg": b"A", "w.bin": b"weights"}
    out = tmp_path / "job.zip"
    out.write_bytes(b"output" * 1000)
    await gcs.put(out, GcsSource(url="gs://demo/out/"), transfer())
    with pytest.raises(WorkerFailed, match=r"^gs://demo/none not found$"):
        await gcs.fetch(GcsSource(url="gs://demo/none"), dest, transfer())
    with pytest.raises(WorkerFailed, match="forbidden: the job attached no gcp key"):
        await Gcs(LOCAL).fetch(GcsSource(url="gs://demo/model/w.bin"), dest, transfer())


# --- Azure ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def azurite(tmp_path_factory: pytest.TempPathFactory, tls: LocalTls) -> Iterator[AzuriteBlob]:
    with running_azurite(tmp_path_factory.mktemp("azurite"), tls=tls) as server:
        e = server.endpoint
        service = BlobServiceClient(
            e.account_url,
            credential={"account_name": e.account_name, "account_key": e.account_key},
            connection_verify=str(e.ca_file),
        )
        container = service.create_container("demo")
        container.upload_blob("sets/coco.tar", _tgz({"img/a.jpg": b"A"}))
        container.upload_blob("data/a.csv", b"x,y\n")
        yield server


async def test_azure_over_https_with_the_ca(
    azurite: AzuriteBlob, dest: Path, tmp_path: Path
) -> None:
    e = azurite.endpoint
    keys = {"azure": {"account_name": e.account_name, "account_key": e.account_key}}
    azure = Azure(LOCAL, e.ca_file)
    await azure.fetch(AzureSource(url=f"{e.account_url}/demo/sets/coco.tar"), dest, transfer(keys))
    await azure.fetch(AzureSource(url=f"{e.account_url}/demo/data/"), dest, transfer(keys))
    assert files(dest) == {"img/a.jpg": b"A", "a.csv": b"x,y\n"}
    out = tmp_path / "job.zip"
    out.write_bytes(b"output")
    await azure.put(out, AzureSource(url=f"{e.account_url}/demo/out/"), transfer(keys))
    with pytest.raises(WorkerFailed, match="demo/none not found"):
        await azure.fetch(AzureSource(url=f"{e.account_url}/demo/none"), dest, transfer(keys))
    wrong = {"azure": {"account_name": e.account_name, "account_key": "d3Jvbmc="}}
    with pytest.raises(WorkerFailed, match="is forbidden"):
        await azure.fetch(
            AzureSource(url=f"{e.account_url}/demo/data/a.csv"), dest, transfer(wrong)
        )


# --- the web ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def www(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("www")
    (root / "data").mkdir()
    (root / "data" / "coco.tgz").write_bytes(_tgz({"img/a.jpg": b"A"}))
    (root / "data" / "w.bin").write_bytes(b"weights")
    return root


@pytest.fixture(scope="module")
def web_server(www: Path, tls: LocalTls) -> Iterator[WebServer]:
    with running_web(www, tls=tls) as server:
        yield server


@pytest.fixture(scope="module")
def ftp_server(www: Path) -> Iterator[FtpServer]:
    with running_ftp(www) as server:
        yield server


async def test_web_over_https_and_ftp(
    web_server: WebServer, ftp_server: FtpServer, dest: Path
) -> None:
    web = Web(LOCAL, web_server.ca_file)
    await web.fetch(WebSource(url=web_server.url("data/coco.tgz")), dest, transfer())
    await web.fetch(WebSource(url=ftp_server.endpoint.url("data/w.bin")), dest, transfer())
    assert files(dest) == {"img/a.jpg": b"A", "w.bin": b"weights"}
    https_by_name = web_server.url("data/w.bin").replace("127.0.0.1", "localhost")
    (dest / "w.bin").unlink()
    await Web(AddressGuard.of(["localhost:" + str(web_server.port)]), web_server.ca_file).fetch(
        WebSource(url=https_by_name), dest, transfer()
    )
    assert (dest / "w.bin").read_bytes() == b"weights"


async def test_web_refusals(web_server: WebServer, ftp_server: FtpServer, dest: Path) -> None:
    web = Web(LOCAL, web_server.ca_file)
    with pytest.raises(WorkerFailed, match=r"data/none\.bin not found$"):
        await web.fetch(WebSource(url=web_server.url("data/none.bin")), dest, transfer())
    with pytest.raises(WorkerFailed, match=r"data/none\.bin not found$"):
        await web.fetch(WebSource(url=ftp_server.endpoint.url("data/none.bin")), dest, transfer())
    with pytest.raises(WorkerFailed, match="too large"):
        await web.fetch(WebSource(url=web_server.url("data/w.bin")), dest, transfer(limit=3))
    for url in (web_server.url("data/w.bin"), ftp_server.endpoint.url("data/w.bin")):
        with pytest.raises(WorkerFailed, match=r"refused address 127\.0\.0\.1: loopback"):
            await Web(AddressGuard(), web_server.ca_file).fetch(
                WebSource(url=url), dest, transfer()
            )
    with pytest.raises(WorkerFailed, match=r"refused address 169\.254\.169\.254: link-local"):
        await web.fetch(WebSource(url="http://169.254.169.254/latest/meta-data/"), dest, transfer())
    assert not any(os.scandir(dest))


@pytest.fixture(scope="module")
def ftps_server(www: Path, tls: LocalTls) -> Iterator[FtpServer]:
    with running_ftp(www, tls=tls) as server:
        yield server


async def test_web_over_ftps_with_the_ca(
    ftps_server: FtpServer, dest: Path, tmp_path: Path
) -> None:
    """Explicit FTPS (AUTH TLS): the server refuses a login or a transfer in the clear, so
    the fetch shows both connections protected."""
    url = ftps_server.endpoint.url("data/w.bin")
    assert url.startswith("ftps://")
    await Web(LOCAL, ftps_server.ca_file).fetch(WebSource(url=url), dest, transfer())
    assert files(dest) == {"w.bin": b"weights"}
    with pytest.raises(WorkerFailed, match=r"data/none\.bin not found$"):
        await Web(LOCAL, ftps_server.ca_file).fetch(
            WebSource(url=ftps_server.endpoint.url("data/none.bin")), dest, transfer()
        )
    other = local_tls(tmp_path / "other-ca")  # a CA that did not sign the server's certificate
    with pytest.raises(
        WorkerFailed,
        match=r"w\.bin: its TLS certificate is not trusted \(unable to get local issuer",
    ):
        await Web(LOCAL, other.ca).fetch(WebSource(url=url), dest, transfer())
    with pytest.raises(WorkerFailed, match=r"refused address 127\.0\.0\.1: loopback"):
        await Web(AddressGuard(), ftps_server.ca_file).fetch(WebSource(url=url), dest, transfer())
    assert files(dest) == {"w.bin": b"weights"}


async def test_web_follows_a_redirect_checking_each_hop(web_server: WebServer, dest: Path) -> None:
    """The file server answers a directory without its slash with a redirect to it."""
    web = Web(LOCAL, web_server.ca_file)
    await web.fetch(WebSource(url=web_server.url("data")), dest, transfer())
    assert b"coco.tgz" in (dest / "data").read_bytes()  # the listing, under the last hop's name


# --- git --------------------------------------------------------------------------------


def _git(*args: str, cwd: Path | None = None) -> str:
    done = subprocess.run(
        ["git", *args], cwd=cwd, env=dict(GIT_ENV), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture(scope="module")
def git_repos(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """model.git with two commits on main, and the first one's id."""
    root = tmp_path_factory.mktemp("git")
    repo = bare_repo(root, "model.git", {"train.py": "print('v1')\n"})
    first = _git("rev-parse", "main", cwd=repo)
    work = root / "work"
    _git("clone", "--quiet", str(repo), str(work))
    (work / "train.py").write_text("print('v2')\n")
    _git("commit", "--quiet", "-am", "v2", cwd=work)
    _git("push", "--quiet", "origin", "main", cwd=work)
    return root, first


@pytest.fixture(scope="module")
def git_server(git_repos: tuple[Path, str]) -> Iterator[tuple[GitHttp, str]]:
    root, first = git_repos
    with running_git_http(root) as server:
        yield server, first


async def test_git_over_http_pinned_to_a_commit_and_a_branch(
    git_server: tuple[GitHttp, str], tmp_path: Path
) -> None:
    server, first = git_server
    worker = tmp_path / "w"
    pinned, head = worker / "mnt/opt/ml/models", worker / "mnt/opt/ml/head"
    pinned.mkdir(parents=True)
    head.mkdir(parents=True)
    keys = {"git": {"token": "s3cret-t0ken"}}
    git = Git(LOCAL)
    await git.fetch(
        GitSource(url=f"{server.url('model.git')}#{first}"),
        pinned,
        transfer(keys, worker_dir=worker),
    )
    await git.fetch(
        GitSource(url=f"{server.url('model.git')}#main"), head, transfer(keys, worker_dir=worker)
    )
    assert (pinned / "train.py").read_text() == "print('v1')\n"
    assert (head / "train.py").read_text() == "print('v2')\n"
    staged = json.loads((worker / "staged.json").read_text())
    assert staged["mnt/opt/ml/models"]["commit"] == first
    assert staged["mnt/opt/ml/head"]["ref"] == "main"
    for f in worker.rglob("*"):  # the token is nowhere on the node
        if f.is_file():
            assert b"s3cret-t0ken" not in f.read_bytes()
    with pytest.raises(WorkerFailed, match="not found"):
        await git.fetch(GitSource(url=server.url("none.git")), head, transfer(worker_dir=worker))
    with pytest.raises(WorkerFailed, match=r"refused address 127\.0\.0\.1: loopback"):
        await Git(AddressGuard()).fetch(GitSource(url=server.url("model.git")), head, transfer())


async def test_git_through_the_cache_clones_a_commit_once_per_node(
    git_server: tuple[GitHttp, str], tmp_path: Path
) -> None:
    """The version is the commit the ref names now (git ls-remote): a second worker of the
    same commit is restaged without a clone; the pinned first commit is another entry."""
    from gpufleet_node_agent.staging.cache import ContentCache

    server, first = git_server
    git, cache = Git(LOCAL), ContentCache(tmp_path / "cache", 64 * MIB)
    fetch = cache.fetcher(git.fetch, git.version)
    keys = {"git": {"token": "s3cret-t0ken"}}
    head = GitSource(url=f"{server.url('model.git')}#main")
    for name in ("a", "b"):
        worker = tmp_path / name
        dest = worker / "mnt/opt/ml/models"
        dest.mkdir(parents=True)
        await fetch(head, dest, transfer(keys, worker_dir=worker, mount="/opt/ml/models"))
        assert (dest / "train.py").read_text() == "print('v2')\n"
        staged = json.loads((worker / "staged.json").read_text())
        assert staged["/opt/ml/models"]["ref"] == "main", staged
    assert (cache.counts.misses, cache.counts.hits) == (1, 1)
    pinned = tmp_path / "c" / "mnt/opt/ml/models"
    pinned.mkdir(parents=True)
    await fetch(GitSource(url=f"{server.url('model.git')}#{first}"), pinned, transfer(keys))
    assert (pinned / "train.py").read_text() == "print('v1')\n"
    assert (cache.counts.misses, cache.counts.hits) == (2, 1)
    with pytest.raises(WorkerFailed, match="not found"):
        await fetch(GitSource(url=server.url("none.git")), pinned, transfer())


@pytest.fixture(scope="module")
def git_ssh(git_repos: tuple[Path, str]) -> Iterator[tuple[GitSsh, str]]:
    root, first = git_repos
    with running_git_ssh(root) as server:
        yield server, first


def _ssh_worker(
    d: Path, server: GitSsh, known_hosts: str | None, monkeypatch: pytest.MonkeyPatch
) -> dict[str, Any]:
    """A worker directory holding the server's client key as its attached `ssh` key, in the
    files the keys step leaves (secrets/ssh/private_key, known_hosts); its keys."""
    monkeypatch.setattr(keyfiles.os, "geteuid", lambda: 1000)  # no tmpfs, no chown
    fields = {"private_key": server.client_key.read_text()}
    if known_hosts is not None:
        fields["known_hosts"] = known_hosts
    d.mkdir()
    write_json_atomic(d / keyfiles.KEYS_FILE, {"ssh": fields})
    assert keyfiles.materialize(d, os.getuid()) is None
    return {"ssh": fields}


def _known(server: GitSsh, key: str | None = None) -> str:
    """A known_hosts line for the server: its host key (or `key`) under `[host]:port`, as
    `ssh-keyscan -p` writes it."""
    line = server.known_hosts()
    if key is None:
        return line
    names, kind, _ = line.split()
    return f"{names} {kind} {key}\n"


async def test_git_over_ssh_with_the_workers_key_and_known_hosts(
    git_ssh: tuple[GitSsh, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, first = git_ssh
    worker = tmp_path / "w"
    keys = _ssh_worker(worker, server, _known(server), monkeypatch)
    assert (worker / "secrets/ssh/private_key").is_file()
    pinned = worker / "mnt/opt/ml/models"
    pinned.mkdir(parents=True)
    git = Git(LOCAL)
    url = server.url("model.git")
    await git.fetch(GitSource(url=f"{url}#{first}"), pinned, transfer(keys, worker_dir=worker))
    assert (pinned / "train.py").read_text() == "print('v1')\n"
    staged = json.loads((worker / "staged.json").read_text())
    assert staged["mnt/opt/ml/models"]["commit"] == first
    head = await git.version(GitSource(url=f"{url}#main"), transfer(keys, worker_dir=worker))
    assert head is not None and len(head) == 40 and head != first
    with pytest.raises(WorkerFailed, match=r"none\.git not found"):
        await git.fetch(
            GitSource(url=server.url("none.git")), pinned, transfer(keys, worker_dir=worker)
        )


async def test_git_over_ssh_refuses_another_host_key_and_a_job_without_a_key(
    git_ssh: tuple[GitSsh, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, first = git_ssh
    not_the_host = server.client_key.with_suffix(".pub").read_text().split()[1]
    worker = tmp_path / "w"
    keys = _ssh_worker(worker, server, _known(server, not_the_host), monkeypatch)
    dest = worker / "mnt/opt/ml/models"
    dest.mkdir(parents=True)
    source = GitSource(url=f"{server.url('model.git')}#{first}")
    with pytest.raises(WorkerFailed, match="its ssh host key is not the known one"):
        await Git(LOCAL).fetch(source, dest, transfer(keys, worker_dir=worker))
    bare = tmp_path / "bare"
    bare.mkdir()
    with pytest.raises(WorkerFailed, match="is forbidden: the job attached no ssh key"):
        await Git(LOCAL).fetch(source, dest, transfer(worker_dir=bare))
    assert not (dest / "train.py").exists()


# --- the inputs step, with the node's fetchers -----------------------------------------


async def test_the_inputs_step_fills_a_workers_mounts_with_the_nodes_fetchers(
    s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """And the bytes it staged and an upload put are counted, as the agent's /metrics
    serve them."""
    from gpufleet_contracts.jobs import Mount, MountKind
    from gpufleet_node_agent.host.metrics import NodeLabels, transfer_families
    from gpufleet_node_agent.settings import AgentSettings
    from gpufleet_node_agent.staging.node import node_staging
    from gpufleet_node_agent.staging.tally import TransferTally
    from gpufleet_node_agent.steps import keys as keyfiles
    from gpufleet_node_agent.steps.inputs import InputsStep
    from gpufleet_node_agent.worker.files import write_json_atomic
    from gpufleet_node_agent.worker.spec import WorkerSpec
    from gpufleet_node_agent.worker.workdir import Worker

    monkeypatch.setattr(keyfiles.os, "geteuid", lambda: 1000)  # no tmpfs, no chown
    settings = AgentSettings(minion_id="n1", staging_allow=f"127.0.0.1:{s3_server.port}")
    tally = TransferTally()
    fetchers, uploaders = node_staging(settings, tally=tally)
    endpoint = s3_server.endpoint.url

    def worker(d: Path, url: str) -> Worker:
        d.mkdir()
        write_json_atomic(d / keyfiles.KEYS_FILE, _wasabi(s3_server))
        assert keyfiles.materialize(d, 1000) is None
        mount = Mount(
            target="/opt/ml/input/coco",
            kind=MountKind.input,
            source=S3Source(url=url, endpoint=endpoint),
        )
        spec = WorkerSpec(
            placement_id="p",
            job_id="j",
            worker=0,
            command=("true",),
            mounts=(mount,),
            owner="acct",
        )
        return Worker(spec, d)

    step = InputsStep(lambda w: [], fetchers)
    w = worker(tmp_path / "ok", "s3://demo/sets/coco.tar.gz")
    await step.setup(w)
    assert files(w.dir / "mnt/opt/ml/input/coco") == {"img/a.jpg": b"A"}
    failed = worker(tmp_path / "failed", "s3://demo/sets/none.tar.gz")
    with pytest.raises(WorkerFailed, match=r"^s3://demo/sets/none\.tar\.gz not found$"):
        await step.setup(failed)
    assert sorted(os.listdir(tmp_path)) == ["failed", "ok"]  # nothing written beside them

    output = tmp_path / "j.zip"
    output.write_bytes(b"output" * 1000)
    out = S3Source(url="s3://demo/out/", endpoint=endpoint)
    await uploaders.put(output, out, transfer(_wasabi(s3_server), job_id="j", account="acct"))
    client = boto3.client("s3", **s3_server.endpoint.boto3_kwargs())
    staged = client.head_object(Bucket="demo", Key="sets/coco.tar.gz")["ContentLength"]
    served = {
        (sample.name, sample.labels["job"], sample.labels["account"], sample.labels["kind"]): (
            sample.value
        )
        for family in transfer_families(NodeLabels("n1", "r", "o"), tally)
        for sample in family.samples
    }
    assert served == {
        ("gpufleet_staged_bytes_total", "j", "acct", "s3"): staged,
        ("gpufleet_uploaded_bytes_total", "j", "acct", "s3"): 6000,
    }
