"""Attack: reading another account's platform object (dataset, model, checkpoint) through any
path that reaches it: the account's requests, the scheduler-only grant, a node's request for
a placement, with the attacker's user, node and the victim's object names.

On the real servers (NATS with its permissions, nx-27017, moto's S3) with the datastore
in-process and the scheduler's part that answers nodes over the victim's stored job; the
package's `system` is not needed (nor started) here.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import nats
import pytest
from cryptography.fernet import Fernet
from gpufleet_bus import Asker, Ports
from gpufleet_contracts import subjects
from gpufleet_contracts.errors import NotFound
from gpufleet_contracts.jobs import JobSpec
from gpufleet_contracts.platform import (
    GetPlatformObject,
    GrantPlatformObject,
    ListPlatformObjects,
    PlatformGrant,
    RemovePlatformObject,
    StagePlatformObject,
)
from gpufleet_datastore.app import build_app
from gpufleet_devstack import EmbeddedMongo, NatsServer
from gpufleet_devstack.storage import S3Server
from gpufleet_scheduler.platform import PlatformStaging
from gpufleet_store import SecretBox
from integration.conftest import as_user, broker_for, connect, running, store_for
from integration.datastore.test_platform_objects import (
    made,
    s3_server,  # noqa: F401  (fixture)
    settings,
)

VICTIM, ATTACKER = "victim", "mallory"
VICTIM_NODE, EVIL_NODE = "victim-node", "evil"
SPEC = {"name": "train", "gpu_types": ["RTX 3090"], "command": ["true"]}


@dataclass
class Held:
    """What PlatformStaging reads of the scheduler's state: its database and its box."""

    db: Any
    box: SecretBox


@pytest.fixture
async def world(
    nats_server: NatsServer,
    mongo_server: EmbeddedMongo,
    db_prefix: str,
    s3_server: S3Server,  # noqa: F811
) -> AsyncIterator[tuple[PlatformStaging, Any]]:
    ds = build_app(
        Ports(
            broker_for("datastore", nats_server),
            store_for("datastore", mongo_server.url, db_prefix),
        ),
        settings(s3_server),
    ).app
    sched_broker = broker_for("scheduler", nats_server)
    sched_store = store_for("scheduler", mongo_server.url, db_prefix)
    spec = JobSpec.model_validate(
        {
            **SPEC,
            "datasets": [{"name": "secret-set"}],
            "output_data": {"type": "platform", "path": "model"},
        }
    )
    await sched_store.db.jobs.insert_one(
        {
            "_id": "job-v",
            "owner": VICTIM,
            "name": "train",
            "spec": spec.model_dump(mode="json", exclude_defaults=True),
            "workers": [
                {"index": 0, "placement_id": "p-v", "minion_id": VICTIM_NODE, "state": "running"}
            ],
        }
    )
    nc = await connect(nats_server, nats_server.creds("service", "scheduler"))
    async with running(ds):
        await sched_broker.connect()
        staging = PlatformStaging(
            Held(sched_store.db, SecretBox(Fernet.generate_key())),  # type: ignore[arg-type]
            Asker(sched_broker),
        )
        await made(nc, VICTIM, "dataset", "secret-set", b"victim data")
        await made(nc, VICTIM, "model", "weights", b"victim model", public=False)
        yield staging, nc
    await nc.close()
    await sched_broker.stop()


async def test_no_path_reads_another_accounts_object(
    world: tuple[PlatformStaging, Any], nats_server: NatsServer
) -> None:
    staging, _ = world
    # the attacker's account: list, show, remove by every name, public listing
    async with as_user(nats_server, ATTACKER) as eve:
        for asset in ("dataset", "model"):
            mine = await eve.call(
                ListPlatformObjects.SUBJECT, json.dumps({"asset": asset}).encode()
            )
            assert mine["objects"] == []
            public = json.dumps({"asset": asset, "public": True}).encode()
            assert all(
                o["account"] != VICTIM
                for o in (await eve.call(ListPlatformObjects.SUBJECT, public))["objects"]
            )
        for asset, name in (("dataset", "secret-set"), ("model", "weights")):
            for said in (name, f"{VICTIM}/{name}"):
                body = json.dumps({"asset": asset, "name": said}).encode()
                for verb in (GetPlatformObject.SUBJECT, RemovePlatformObject.SUBJECT):
                    got = await eve.call(verb, body)
                    assert got["error"]["code"] in ("not_found", "invalid"), got
        # the grant subject and the scheduler's node subject are not the user's to publish
        errors: list[Exception] = []

        async def on_error(exc: Exception) -> None:
            errors.append(exc)

        user = await connect(
            nats_server, nats_server.creds("user", "eve", account=ATTACKER), error_cb=on_error
        )
        grant = {
            "account": VICTIM,
            "asset": "dataset",
            "name": "secret-set",
            "mode": "read",
            "job_id": "job-v",
        }
        with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
            await user.request(GrantPlatformObject.SUBJECT, json.dumps(grant).encode(), timeout=1)
        await user.close()
        assert any("permissions violation" in str(e).lower() for e in errors)

    # a node: only its own subject, and only for a placement it holds, and only what the
    # job names
    errors = []

    async def node_error(exc: Exception) -> None:
        errors.append(exc)

    evil = await connect(nats_server, nats_server.creds("node", EVIL_NODE), error_cb=node_error)
    stage = {
        "job_id": "job-v",
        "placement_id": "p-v",
        "worker": 0,
        "asset": "dataset",
        "name": "secret-set",
        "mode": "read",
    }
    for as_who in (VICTIM_NODE, "*"):
        with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
            await evil.request(
                subjects.as_node(StagePlatformObject.SUBJECT, as_who),
                json.dumps(stage).encode(),
                timeout=1,
            )
    await evil.close()
    assert any("permissions violation" in str(e).lower() for e in errors)
    asked = StagePlatformObject.model_validate(stage)
    with pytest.raises(NotFound):
        await staging.stage(asked, EVIL_NODE)  # its own subject, not its placement
    not_named = StagePlatformObject.model_validate({**stage, "asset": "model", "name": "weights"})
    with pytest.raises(NotFound):
        await staging.stage(not_named, VICTIM_NODE)  # the victim's, not the job's
    # the victim's own node, for its job's dataset: the one path that reads it
    granted = await staging.stage(asked, VICTIM_NODE)
    assert isinstance(granted, PlatformGrant) and granted.account == VICTIM
    write = StagePlatformObject.model_validate(
        {**stage, "asset": "model", "name": None, "mode": "write"}
    )
    out = await staging.stage(write, VICTIM_NODE)
    assert (out.account, out.name, out.method) == (VICTIM, "train", "PUT")
    _ = uuid  # ids above are fixed: one victim per test database (db_prefix)
