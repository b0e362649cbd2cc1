"""Jobs get their data and return their outputs, through the running system and the CLI,
against the storage servers of `just up --data` (real S3, GCS, Azure Blob, git and web
servers on this machine): the demo job as `just up --data` prints it (its dataset an
archive from S3, its code from git over http, a platform checkpoint it reads at
/opt/ml/checkpoint, its output to Azure) ends `finished` after
`uploading`, and the container holds `<name>.zip` with exactly what it wrote; the same from
and to GCS; a two-worker job uploads one zip per worker; a missing object, an archive with
a `../` entry and an address the operator did not allow each fail the job with the reason,
leaving nothing outside the worker's directory; a job's `platform` model output is a later
job's model code; a second job with the same dataset on the node transfers no bytes; a job
with `local` input and output waits for `gpufleet job connect`, which sends a directory from
this machine and receives the job's zip; the demo endpoint, as the README shows it, answers
its two routes through its URL.

Workers run in containers (the agent's default), as on a node that sells its GPUs.
"""

from __future__ import annotations

import asyncio
import io
import json
import shutil
import struct
import tarfile
import time
import zipfile
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import yaml
from gpufleet_devstack.processes import free_port
from gpufleet_devstack.storage import demo
from gpufleet_devstack.storage.servers import StorageServers, free_storage_ports
from gpufleet_node_agent.baseimage import BASE_IMAGE, default_containers_conf, ensure_image
from gpufleet_node_agent.baseimage import podman_env as make_podman_env

from .conftest import System

pytestmark = pytest.mark.skipif(
    shutil.which("podman") is None, reason="podman is not installed (just setup installs it)"
)


class Staged:
    """The system, with the storage servers its node agent was told of."""

    def __init__(self, system: System, storage: StorageServers) -> None:
        self.system, self.storage = system, storage

    def s3(self) -> Any:
        import boto3

        return boto3.client("s3", **self.storage.s3.endpoint.boto3_kwargs())

    def gcs_bucket(self) -> Any:
        from google.auth.credentials import AnonymousCredentials
        from google.cloud.storage import Client

        endpoint = self.storage.gcs.endpoint
        client = Client(
            project=endpoint.project,
            credentials=AnonymousCredentials(),  # type: ignore[no-untyped-call]
            client_options={"api_endpoint": endpoint.url},
        )
        return client.bucket(demo.BUCKET)

    def azure_container(self) -> Any:
        from azure.storage.blob import BlobServiceClient

        endpoint = self.storage.azure.endpoint
        service = BlobServiceClient(
            endpoint.account_url,
            credential={"account_name": endpoint.account_name, "account_key": endpoint.account_key},
            connection_verify=str(endpoint.ca_file),
        )
        return service.get_container_client(demo.BUCKET)

    def submit_file(self, spec: dict[str, Any], name: str) -> str:
        path = self.system.root / f"{name}.yaml"
        path.write_text(yaml.safe_dump({**spec, "name": name}))
        job = self.system.json("job", "submit", "-f", str(path))
        return str(job["id"])

    def reason(self, job: dict[str, Any]) -> str:
        return json.dumps([job["history"][-1], [w.get("reason") for w in job["workers"]]])


@pytest.fixture(scope="module")
def staged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Staged]:
    error = asyncio.run(ensure_image(BASE_IMAGE, make_podman_env(default_containers_conf())))
    assert error is None, error
    root = tmp_path_factory.mktemp("staging")
    storage = StorageServers(root / "storage", root / "logs", free_storage_ports())
    storage.start()
    try:
        storage.seed()
        agent_env = {
            **storage.agent_env(),
            "GPUFLEET_PROXY_LISTEN": f"127.0.0.1:{free_port()}",  # the demo endpoint's URL
            "GPUFLEET_STOP_WORKERS_ON_EXIT": "true",  # its containers go with the system
        }
        system = System(  # containers; the datastore's platform objects in the S3 server
            root / "system", agent_env=agent_env, service_env=storage.platform_env()
        )
        try:
            system.start()
            storage.seed_platform(system.mongo.url, "local")  # the demo's checkpoint
            for kind in ("wasabi", "azure"):
                system.cli(
                    "key", "add", kind, "--from-file", str(storage.keys_dir / f"{kind}.json")
                )
            yield Staged(system, storage)
        finally:
            system.stop()
    finally:
        storage.stop()


def _zip_names(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return {n: z.read(n) for n in z.namelist()}


def _wrote(files: dict[str, bytes]) -> None:
    """What the demo's train.py writes, and the manifest of it."""
    assert set(files) == {"model.json", "metrics.json", "MANIFEST.sha256"}, sorted(files)
    model = json.loads(files["model.json"])
    assert abs(model["a"] - 3) < 0.2 and abs(model["b"] - 2) < 0.5, model
    manifest = files["MANIFEST.sha256"].decode()
    assert "model.json" in manifest and "metrics.json" in manifest


def test_the_demo_job_as_printed_stages_from_s3_and_git_and_uploads_to_azure(
    staged: Staged,
) -> None:
    system = staged.system
    job = system.json("job", "submit", "-f", str(staged.storage.job_file))
    done = system.wait_state(job["id"], "finished", "failed", timeout=300)
    assert done["state"] == "finished", staged.reason(done)
    states = [h["state"] for h in done["history"]]
    assert states.index("running") < states.index("uploading") < states.index("finished"), states
    logs = system.cli("job", "logs", job["id"]).stdout
    assert "mean absolute error" in logs
    assert f"checkpoint {demo.CHECKPOINT}: from y = 1.0 * x + 0.0" in logs, logs
    blob = staged.azure_container().download_blob(f"outputs/{demo.JOB_NAME}.zip").readall()
    _wrote(_zip_names(blob))


def test_a_second_job_with_the_same_dataset_on_the_node_transfers_no_bytes(
    staged: Staged,
) -> None:
    """The demo job again (after the first one): its dataset from the node's cache, only its
    version asked of S3."""
    log = staged.storage.s3.log_file

    def gets() -> int:
        path = f"GET /{demo.BUCKET}/{demo.DATASET}"
        return sum(path in line for line in log.read_text(errors="replace").splitlines())

    before = gets()
    assert before >= 1  # the first demo job's download
    job = staged.system.json("job", "submit", "-f", str(staged.storage.job_file))
    done = staged.system.wait_state(job["id"], "finished", "failed", timeout=300)
    assert done["state"] == "finished", staged.reason(done)
    assert gets() == before


def test_a_job_stages_from_and_to_gcs(staged: Staged) -> None:
    spec = yaml.safe_load(staged.storage.job_file.read_text())
    spec["input_data"] = {"type": "gcp", "path": f"gs://{demo.BUCKET}/{demo.DATASET}"}
    spec["output_data"] = {"type": "gcp", "path": f"gs://{demo.BUCKET}/outputs/"}
    spec["environment"] = {"keys": []}
    job_id = staged.submit_file(spec, "fit-gcs")
    done = staged.system.wait_state(job_id, "finished", "failed", timeout=300)
    assert done["state"] == "finished", staged.reason(done)
    _wrote(_zip_names(staged.gcs_bucket().blob("outputs/fit-gcs.zip").download_as_bytes()))


def test_a_two_worker_job_uploads_one_zip_per_worker(staged: Staged) -> None:
    endpoint = staged.storage.s3.endpoint.url
    spec = {
        "type": "training",
        "gpu_types": ["RTX 3090"],
        "gpu_count": 1,
        "workers": 2,
        "max_price": "1.0",
        "output_data": {"type": "wasabi", "path": "s3://demo/two/", "endpoint": endpoint},
        "environment": {"keys": ["wasabi"]},
        "worker_commands": [
            ["sh", "-c", "echo first > /opt/ml/output/who.txt"],
            ["sh", "-c", "echo second > /opt/ml/output/who.txt"],
        ],
    }
    job_id = staged.submit_file(spec, "two")
    done = staged.system.wait_state(job_id, "finished", "failed", timeout=300)
    assert done["state"] == "finished", staged.reason(done)
    s3 = staged.s3()
    for worker, said in ((0, b"first\n"), (1, b"second\n")):
        data = s3.get_object(Bucket="demo", Key=f"two/two_{worker}.zip")["Body"].read()
        files = _zip_names(data)
        assert files["who.txt"] == said and set(files) == {"who.txt", "MANIFEST.sha256"}


def _escaping_archive() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as archive:
        data = b"outside\n"
        info = tarfile.TarInfo("../../escaped-by-staging.txt")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _oversize_archive() -> bytes:
    """A zip whose three entries say they unpack to 4 GiB each, more than the worker's disk
    (a zip bomb's directory): refused from what it declares, before a byte is unpacked."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for name in ("a.bin", "b.bin", "c.bin"):
            archive.writestr(name, b"x")
    data = bytearray(out.getvalue())
    at = data.find(b"PK\x01\x02")  # each central directory record: its uncompressed size
    while at != -1:
        struct.pack_into("<I", data, at + 24, 0xFFFFFFF0)
        at = data.find(b"PK\x01\x02", at + 4)
    return bytes(data)


@pytest.mark.parametrize(
    ("case", "says"),
    [
        ("missing", "not found"),
        ("escaping", "unsafe archive"),
        ("oversize", "is too large"),
        ("loopback", "refused address"),
        ("metadata", "refused address"),
    ],
)
def test_a_bad_source_fails_the_job_with_its_reason(staged: Staged, case: str, says: str) -> None:
    endpoint = staged.storage.s3.endpoint.url
    s3_input = {"type": "wasabi", "endpoint": endpoint}
    if case == "escaping":
        staged.s3().put_object(Bucket="demo", Key="escaping.tar.gz", Body=_escaping_archive())
    if case == "oversize":
        staged.s3().put_object(Bucket="demo", Key="oversize.zip", Body=_oversize_archive())
    source = {
        "missing": {**s3_input, "path": "s3://demo/nope.tar.gz"},
        "escaping": {**s3_input, "path": "s3://demo/escaping.tar.gz"},
        "oversize": {**s3_input, "path": "s3://demo/oversize.zip"},
        # NATS's own port: on this machine, but not among the operator's allowed addresses
        "loopback": {"type": "web", "path": f"{staged.system.nats_url.replace('nats', 'http')}/x"},
        "metadata": {"type": "web", "path": "http://169.254.169.254/latest/meta-data/"},
    }[case]
    spec = {
        "type": "inference",
        "gpu_types": ["RTX 3090"],
        "gpu_count": 1,
        "max_price": "1.0",
        "input_data": source,
        "environment": {"keys": ["wasabi"]},
        "command": ["true"],
    }
    job_id = staged.submit_file(spec, f"bad-{case}")
    done = staged.system.wait_state(job_id, "finished", "failed", timeout=180)
    assert done["state"] == "failed" and says in staged.reason(done), staged.reason(done)
    assert not list(staged.system.root.parent.rglob("escaped-by-staging.txt"))
    assert not list(staged.system.root.rglob("c.bin"))


def test_a_platform_model_output_is_a_later_jobs_model(staged: Staged) -> None:
    system = staged.system
    spec = {
        "type": "training",
        "gpu_types": ["RTX 3090"],
        "gpu_count": 1,
        "max_price": "1.0",
        "output_data": {"type": "platform", "path": "model"},
        "command": ["sh", "-c", "echo 'weights 42' > /opt/ml/output/weights.txt"],
    }
    job_id = staged.submit_file(spec, "trained")
    done = system.wait_state(job_id, "finished", "failed", timeout=300)
    assert done["state"] == "finished", staged.reason(done)
    listed = system.json("model", "list")["objects"]
    (model,) = [m for m in listed if m["name"] == "trained"]
    assert model["state"] == "ready" and model["job_id"] == job_id, model

    spec = {
        "type": "training",
        "gpu_types": ["RTX 3090"],
        "gpu_count": 1,
        "max_price": "1.0",
        "model": {"source": "platform", "path": "trained"},
        "command": ["cat", "/opt/ml/models/weights.txt"],
    }
    job_id = staged.submit_file(spec, "uses-trained")
    done = system.wait_state(job_id, "finished", "failed", timeout=300)
    assert done["state"] == "finished", staged.reason(done)
    assert "weights 42" in system.cli("job", "logs", job_id).stdout


def test_local_data_goes_through_job_connect(staged: Staged) -> None:
    system = staged.system
    data = system.root / "local-data"
    (data / "sub").mkdir(parents=True)
    (data / "a.txt").write_text("alpha\n")
    (data / "sub" / "b.txt").write_text("beta\n")
    spec = {
        "type": "inference",
        "gpu_types": ["RTX 3090"],
        "gpu_count": 1,
        "max_price": "1.0",
        "input_data": {"type": "local", "path": str(data)},
        "output_data": {"type": "local", "path": "~/results"},
        "command": [
            "sh",
            "-c",
            "cat /opt/ml/input/a.txt /opt/ml/input/sub/b.txt > /opt/ml/output/both.txt",
        ],
    }
    job_id = staged.submit_file(spec, "connected")
    deadline = time.monotonic() + 180
    while "waiting for you to connect" not in str(system.job(job_id).get("progress")):
        assert time.monotonic() < deadline, system.job(job_id)
        time.sleep(1)
    assert system.job(job_id)["state"] == "starting"
    into = system.root / "received"
    connected = system.cli("job", "connect", job_id, "--into", str(into), timeout=300)
    assert f"sent {data}" in connected.stdout, connected.stdout + connected.stderr
    done = system.wait_state(job_id, "finished", "failed", timeout=60)
    assert done["state"] == "finished", staged.reason(done)
    files = _zip_names((into / "connected.zip").read_bytes())
    assert files["both.txt"] == b"alpha\nbeta\n" and set(files) == {"both.txt", "MANIFEST.sha256"}


def test_the_demo_endpoint_as_the_readme_shows_it_answers_its_routes(staged: Staged) -> None:
    system = staged.system
    job_id = str(system.json("job", "submit", "-f", str(staged.storage.endpoint_file))["id"])
    try:
        key = system.cli("endpoint", "key", "create", job_id, "--name", "ci").stdout.strip()
        deadline = time.monotonic() + 120
        while (opened := system.cli("job", "open", job_id, check=False)).returncode != 0:
            assert time.monotonic() < deadline, opened.stderr
            time.sleep(0.5)
        url = httpx.URL(opened.stdout.strip())  # http://<job>.localhost:<port>, as curl takes it
        with httpx.Client(base_url=f"http://127.0.0.1:{url.port}", timeout=120) as c:
            headers = {"host": f"{url.host}:{url.port}", "authorization": f"Bearer {key}"}
            added = c.post("/sum", json={"a": 1}, headers=headers)
            line = c.post("/line", json={"x": 2}, headers=headers)
        assert (added.status_code, added.json()) == (200, {"sum": 3}), added.text
        assert (line.status_code, line.json()) == (200, {"y": 8.0}), line.text
    finally:
        system.cli("job", "cancel", job_id, check=False)
