"""Attack: reaching another account's `local` data (what `gpufleet job connect` relays
between the user's machine and the node) through any path: the attacker's `job connect`
and `local_data_sent` for the victim's job, the scheduler-only grant subject, a node
request on the victim node's subject or for a placement the attacker's node does not hold.

On the real servers (NATS with its permissions, nx-27017, moto's S3) with the datastore
in-process and the scheduler's part that answers users and nodes over the victim's stored
job; the package's `system` is not needed (nor started) here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import nats
import pytest
from cryptography.fernet import Fernet
from gpufleet_bus import Asker, Ports
from gpufleet_contracts import subjects
from gpufleet_contracts.errors import NotFound
from gpufleet_contracts.jobs import JobSpec
from gpufleet_contracts.localdata import (
    CompleteLocalUpload,
    ConnectJob,
    GrantRelay,
    LocalDataSent,
    LocalFile,
    StageLocalData,
)
from gpufleet_datastore.app import build_app
from gpufleet_devstack import EmbeddedMongo, NatsServer
from gpufleet_devstack.storage import S3Server
from gpufleet_scheduler.localdata import LocalRelay
from gpufleet_scheduler.platform import PlatformStaging
from gpufleet_store import SecretBox
from integration.conftest import broker_for, connect, running, store_for
from integration.datastore.test_platform_objects import (
    s3_server,  # noqa: F401  (fixture)
    settings,
)

VICTIM, ATTACKER = "victim", "mallory"
VICTIM_NODE, EVIL_NODE = "victim-node", "evil"
MOUNT = "/opt/ml/input"
SPEC = {
    "name": "fit",
    "type": "inference",
    "gpu_types": ["RTX 3090"],
    "command": ["true"],
    "input_data": {"type": "local", "path": "~/private"},
    "output_data": {"type": "local", "path": "~/results"},
}


@dataclass
class Held:
    """What the scheduler's parts read of its state: its database and its box."""

    db: Any
    box: SecretBox


@pytest.fixture
async def relay(
    nats_server: NatsServer,
    mongo_server: EmbeddedMongo,
    db_prefix: str,
    s3_server: S3Server,  # noqa: F811
) -> AsyncIterator[LocalRelay]:
    ds = build_app(
        Ports(
            broker_for("datastore", nats_server),
            store_for("datastore", mongo_server.url, db_prefix),
        ),
        settings(s3_server),
    ).app
    sched_broker = broker_for("scheduler", nats_server)
    sched_store = store_for("scheduler", mongo_server.url, db_prefix)
    spec = JobSpec.model_validate(SPEC)
    await sched_store.db.jobs.insert_one(
        {
            "_id": "job-v",
            "owner": VICTIM,
            "name": "fit",
            "state": "starting",
            "spec": spec.model_dump(mode="json", exclude_defaults=True),
            "workers": [
                {"index": 0, "placement_id": "p-v", "minion_id": VICTIM_NODE, "state": "placed"}
            ],
        }
    )
    async with running(ds):
        await sched_broker.connect()
        state = Held(sched_store.db, SecretBox(Fernet.generate_key()))
        staging = PlatformStaging(state, Asker(sched_broker))  # type: ignore[arg-type]
        yield LocalRelay(state, Asker(sched_broker), staging.held)  # type: ignore[arg-type]
    await sched_broker.stop()


async def _permission_refused(nats_server: NatsServer, creds: Any, subject: str) -> None:
    errors: list[Exception] = []

    async def on_error(exc: Exception) -> None:
        errors.append(exc)

    nc = await connect(nats_server, creds, error_cb=on_error)
    with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
        await nc.request(subject, b"{}", timeout=1)
    await nc.close()
    assert any("permissions violation" in str(e).lower() for e in errors)


async def test_only_the_jobs_account_and_node_reach_its_local_data(
    relay: LocalRelay, nats_server: NatsServer
) -> None:
    sending = ConnectJob(job_id="job-v", sending=[LocalFile(mount=MOUNT, name="private.tar")])
    # the attacker's account: its connect, its "sent", for the victim's job
    for asked in (ConnectJob(job_id="job-v"), sending):
        with pytest.raises(NotFound):
            await relay.connect(asked, ATTACKER)
    with pytest.raises(NotFound):
        await relay.sent(LocalDataSent(job_id="job-v", mount=MOUNT), ATTACKER)

    # the victim's node waits for it
    read = StageLocalData(job_id="job-v", placement_id="p-v", worker=0, mount=MOUNT, mode="read")
    waiting = await relay.stage(read, VICTIM_NODE)
    assert (waiting.state, waiting.grant) == ("waiting", None)
    # the victim sends its data
    conn = await relay.connect(sending, VICTIM)
    (grant,) = conn.uploads
    assert grant.method == "PUT" and conn.outputs_expected == 1
    async with httpx.AsyncClient() as http:
        assert (await http.put(grant.url, content=b"victim data")).status_code == 200
    sent = await relay.sent(LocalDataSent(job_id="job-v", mount=MOUNT), VICTIM)
    assert (sent.state, sent.size) == ("ready", 11)

    # the attacker's node: its own subject, no placement of the job
    with pytest.raises(NotFound):
        await relay.stage(read, EVIL_NODE)
    write = read.model_copy(update={"mount": "output", "mode": "write"})
    with pytest.raises(NotFound):
        await relay.stage(write, EVIL_NODE)
    with pytest.raises(NotFound):
        await relay.complete(
            CompleteLocalUpload(job_id="job-v", placement_id="p-v", worker=0), EVIL_NODE
        )
    # the victim's node, for a mount the job does not name
    with pytest.raises(NotFound):
        await relay.stage(read.model_copy(update={"mount": "/etc"}), VICTIM_NODE)
    # and only on its own subject, which the attacker cannot publish; nor the grants
    node_creds = nats_server.creds("node", EVIL_NODE)
    for as_who in (VICTIM_NODE, "*"):
        subject = subjects.as_node(StageLocalData.SUBJECT, as_who)
        await _permission_refused(nats_server, node_creds, subject)
    user_creds = nats_server.creds("user", "eve", account=ATTACKER)
    await _permission_refused(nats_server, user_creds, GrantRelay.SUBJECT)

    # the one path that reads it: the victim's node holding the placement
    staged = await relay.stage(read, VICTIM_NODE)
    assert staged.state == "ready" and staged.grant is not None
    async with httpx.AsyncClient() as http:
        assert (await http.get(staged.grant.url)).content == b"victim data"
    # the attacker's connect still gets no URL after it was sent
    with pytest.raises(NotFound):
        await relay.connect(ConnectJob(job_id="job-v"), ATTACKER)
