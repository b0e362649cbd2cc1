"""The relay of jobs' `local` data (relay.py) on nx-27017 and moto's S3: a node's read is
`waiting` until the file is put and said done, a completion with nothing put is refused, a
file sent again under another name replaces the first's bytes, and what was relayed
RELAY_DAYS ago is removed, bytes and record."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from gpufleet_contracts.errors import Refused
from gpufleet_contracts.localdata import RELAY_DAYS, CompleteRelay, GrantRelay
from gpufleet_datastore.app import build_bucket
from gpufleet_datastore.relay import Relay
from gpufleet_devstack import EmbeddedMongo
from gpufleet_devstack.storage import S3Server

from ..conftest import store_for
from .test_platform_objects import s3_server, settings  # noqa: F401  (fixture)

MOUNT = "/opt/ml/input"


async def test_a_relayed_file_is_waited_for_sent_replaced_and_expired(
    mongo_server: EmbeddedMongo,
    db_prefix: str,
    s3_server: S3Server,  # noqa: F811
) -> None:
    now = [datetime(2030, 1, 1, tzinfo=UTC)]
    bucket = build_bucket(settings(s3_server))
    assert bucket is not None
    await bucket.ensure()
    db = store_for("datastore", mongo_server.url, db_prefix).db
    relay = Relay(db, bucket, lambda: now[0], 600)
    job = uuid.uuid4().hex
    read = GrantRelay(account="acme", job_id=job, mount=MOUNT, mode="read")
    assert (await relay.grant(read)).state == "waiting"

    first = await relay.grant(read.model_copy(update={"mode": "write", "name": "a.tar"}))
    assert first.state == "uploading" and first.grant is not None
    done = CompleteRelay(account="acme", job_id=job, mount=MOUNT)
    with pytest.raises(Refused, match="nothing was put"):
        await relay.complete(done)
    async with httpx.AsyncClient() as http:
        assert (await http.put(first.grant.url, content=b"first")).status_code == 200
        # sent again under another name: the first's bytes go
        second = await relay.grant(read.model_copy(update={"mode": "write", "name": "b.tar"}))
        assert second.grant is not None
        assert (await http.put(second.grant.url, content=b"second")).status_code == 200
        assert await bucket.stored(f"local/{job}/opt_ml_input/0/a.tar") is None
        assert (await relay.grant(read)).state == "waiting"  # not said done yet
        view = await relay.complete(done)
        assert (view.state, view.size, view.name) == ("ready", 6, "b.tar")
        ready = await relay.grant(read)
        assert ready.state == "ready" and ready.grant is not None
        assert (await http.get(ready.grant.url)).content == b"second"
    assert [r.name for r in (await relay.list("acme", job)).relayed] == ["b.tar"]
    assert (await relay.list("other", job)).relayed == []

    now[0] += timedelta(days=RELAY_DAYS, seconds=1)
    await relay.expire()
    assert (await relay.list("acme", job)).relayed == []
    assert await bucket.stored(f"local/{job}/opt_ml_input/0/b.tar") is None
    assert (await relay.grant(read)).state == "waiting"
