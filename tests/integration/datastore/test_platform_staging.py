"""The node's `platform` fetcher and uploader (gpufleet_node_agent.staging.platform) on the
real servers (NATS with its permissions, nx-27017, moto's S3): the datastore and the
scheduler running as services, a job of the account's stored with its worker placed on the
node, and the node asking over its own credential's connection (its answers to its own
inbox). The node gets a ready object of the job's account into a directory and puts its
output (then `ready`, with its size and checksum); another node is refused; the presigned
URL is in no reason and no log."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import uuid
import zipfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from cryptography.fernet import Fernet
from faststream.nats import NatsBroker
from gpufleet_bus import BusSettings, Ports, make_broker
from gpufleet_contracts.jobs import JobSpec
from gpufleet_contracts.locations import PlatformAsset, PlatformRef
from gpufleet_contracts.platform import GetPlatformObject
from gpufleet_datastore.app import build_app
from gpufleet_devstack import EmbeddedMongo, NatsServer
from gpufleet_devstack.storage import S3Server
from gpufleet_node_agent.agent import bus_requester
from gpufleet_node_agent.staging.guard import AddressGuard
from gpufleet_node_agent.staging.platform import Platform
from gpufleet_node_agent.staging.registry import Moved, Transfer
from gpufleet_node_agent.steps.base import WorkerFailed
from gpufleet_scheduler.app import build_app as scheduler_app
from gpufleet_scheduler.settings import SchedulerSettings
from nats.aio.client import Client

from ..conftest import as_user, broker_for, connect, running, store_for
from .test_platform_objects import made, s3_server, settings  # noqa: F401  (fixture)

NODE, OTHER_NODE = "data-node", "other-node"
FILES = {"train/a.txt": b"alpha", "b.bin": bytes(range(256)) * 40}


def _zip(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return out.getvalue()


def node_broker(server: NatsServer, minion: str) -> NatsBroker:
    creds = server.creds("node", minion)
    return make_broker("node-agent", BusSettings(nats_url=server.url, nats_creds=creds))


class Heard:
    def __init__(self) -> None:
        self.moved: list[Moved] = []

    def __call__(self, moved: Moved) -> None:
        self.moved.append(moved)


def transfer(limit: int = 10**9, *, job: str = "job-p", placement: str = "p-1") -> Transfer:
    return Transfer({}, limit, Heard(), job_id=job, placement_id=placement, worker=0)


@pytest.fixture
async def world(
    nats_server: NatsServer,
    mongo_server: EmbeddedMongo,
    db_prefix: str,
    s3_server: S3Server,  # noqa: F811
) -> AsyncIterator[tuple[str, Client, dict[str, Platform]]]:
    account = f"acct{uuid.uuid4().hex[:6]}"
    ds = build_app(
        Ports(
            broker_for("datastore", nats_server),
            store_for("datastore", mongo_server.url, db_prefix),
        ),
        settings(s3_server),
    ).app
    sched_store = store_for("scheduler", mongo_server.url, db_prefix)
    sched = scheduler_app(
        Ports(broker_for("scheduler", nats_server), sched_store),
        SchedulerSettings(secret_key=Fernet.generate_key().decode()),
    ).app
    spec = JobSpec.model_validate(
        {
            "name": "train",
            "gpu_types": ["RTX 3090"],
            "command": ["true"],
            "datasets": [{"name": "corpus"}],
            "output_data": {"type": "platform", "path": "model"},
        }
    )
    nc = await connect(nats_server, nats_server.creds("service", "scheduler"))
    brokers = {m: node_broker(nats_server, m) for m in (NODE, OTHER_NODE)}
    async with running(ds, sched):
        await sched_store.db.jobs.insert_one(
            {
                "_id": "job-p",
                "owner": account,
                "name": "train",
                "state": "running",
                "spec": spec.model_dump(mode="json", exclude_defaults=True),
                "workers": [
                    {"index": 0, "placement_id": "p-1", "minion_id": NODE, "state": "running"}
                ],
            }
        )
        for b in brokers.values():
            await b.connect()
        await made(nc, account, "dataset", "corpus", _zip(FILES))
        nodes = {m: Platform(m, bus_requester(b), AddressGuard()) for m, b in brokers.items()}
        yield account, nc, nodes
        for b in brokers.values():
            await b.stop()
    await nc.close()


async def test_a_node_fetches_and_puts_its_jobs_platform_objects(
    world: tuple[str, Client, dict[str, Platform]],
    nats_server: NatsServer,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    account, _, nodes = world
    node, other = nodes[NODE], nodes[OTHER_NODE]
    source = PlatformRef(asset=PlatformAsset.dataset, name="corpus")
    reasons: list[str] = []

    # the node's own placement, the job's dataset: unpacked into the directory; the store's
    # loopback host:port reached although the guard allows nothing
    dest = tmp_path / "corpus"
    dest.mkdir()
    t = transfer()
    await node.fetch(source, dest, t)
    assert {p.relative_to(dest).as_posix(): p.read_bytes() for p in dest.rglob("*.*")} == FILES
    heard = t.progress.moved  # type: ignore[attr-defined]
    assert heard and heard[-1].done == heard[-1].total == len(_zip(FILES))

    # within the disk left: past it, too large, nothing left behind
    small = tmp_path / "small"
    small.mkdir()
    with pytest.raises(WorkerFailed) as too_large:
        await node.fetch(source, small, transfer(limit=100))
    assert "dataset corpus is too large" in too_large.value.reason
    assert list(small.iterdir()) == []
    reasons.append(too_large.value.reason)

    # another node, its own subject: not its placement
    with pytest.raises(WorkerFailed) as refused:
        await other.fetch(source, tmp_path, transfer())
    assert refused.value.reason == "dataset corpus not found"
    # a dataset the job does not name, or no such placement
    for asked, t2 in (
        (PlatformRef(asset=PlatformAsset.dataset, name="other"), transfer()),
        (source, transfer(placement="p-2")),
    ):
        with pytest.raises(WorkerFailed) as not_named:
            await node.fetch(asked, tmp_path, t2)
        assert not_named.value.reason.endswith("not found")
        reasons.append(not_named.value.reason)

    # the output: put, then read back by the datastore
    out = tmp_path / "train.zip"
    out.write_bytes(_zip({"weights.bin": b"w" * 5000}))
    target = PlatformRef(asset=PlatformAsset.model)
    with pytest.raises(WorkerFailed) as not_mine:
        await other.put(out, target, transfer())
    assert not_mine.value.reason == "model output not found"
    told = transfer()
    await node.put(out, target, told)
    assert told.progress.moved[-1].done == out.stat().st_size  # type: ignore[attr-defined]
    async with as_user(nats_server, account) as user:
        shown = await user.call(
            GetPlatformObject.SUBJECT, json.dumps({"asset": "model", "name": "train"}).encode()
        )
    assert shown["state"] == "ready", shown
    assert shown["size"] == out.stat().st_size
    assert shown["sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
    assert shown["job_id"] == "job-p"

    # the presigned URLs are credentials: in no reason and no log line
    # (the node's loggers and its http client's: the datastore signs them, and says so at
    # DEBUG, in this same process)
    node_side = ("gpufleet.node_agent", "gpufleet.node-agent", "httpx", "httpcore", "nats")
    lines = [r.getMessage() for r in caplog.records if r.name.startswith(node_side)]
    logged = "\n".join(lines + reasons + [refused.value.reason, not_mine.value.reason])
    for secret in ("X-Amz-Signature", "X-Amz-Credential", "Signature=", "AWSAccessKeyId"):
        assert secret not in logged
    assert "platform/" not in logged  # nor the object's key in the store
