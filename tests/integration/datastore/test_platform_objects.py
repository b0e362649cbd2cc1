"""Platform objects on the real servers (NATS with its permissions, nx-27017, moto's S3): an
account's objects are its own (another account's are "not found" for list, show, remove and
a grant), a public one is readable but not removable, and only the scheduler may ask for a
presigned URL."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
from gpufleet_bus import Ports
from gpufleet_contracts.platform import (
    CompletePlatformObject,
    GetPlatformObject,
    GrantPlatformObject,
    ListPlatformObjects,
    RemovePlatformObject,
)
from gpufleet_datastore.app import PlatformSettings, build_app
from gpufleet_devstack import EmbeddedMongo, NatsServer
from gpufleet_devstack.storage import S3Server, running_s3
from nats.aio.client import Client

from ..conftest import as_user, broker_for, connect, running, store_for

BUCKET = "platform"


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with running_s3(tmp_path_factory.mktemp("s3")) as server:
        yield server


def settings(s3: S3Server) -> PlatformSettings:
    e = s3.endpoint
    return PlatformSettings(
        s3_endpoint=e.url,
        bucket=BUCKET,
        access_key_id=e.access_key_id,
        secret_access_key=e.secret_access_key,  # type: ignore[arg-type]
        create_bucket=True,
    )


async def ask(nc: Client, subject: str, body: dict[str, Any]) -> dict[str, Any]:
    reply = await nc.request(subject, json.dumps(body).encode(), timeout=10)
    data: dict[str, Any] = json.loads(reply.data)
    return data


@pytest.fixture
async def datastore(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str, s3_server: S3Server
) -> AsyncIterator[None]:
    app = build_app(
        Ports(
            broker_for("datastore", nats_server),
            store_for("datastore", mongo_server.url, db_prefix),
        ),
        settings(s3_server),
    ).app
    async with running(app):
        yield


@pytest.fixture
async def scheduler_nc(nats_server: NatsServer) -> AsyncIterator[Client]:
    nc = await connect(nats_server, nats_server.creds("service", "scheduler"))
    yield nc
    await nc.close()


async def made(
    nc: Client, account: str, asset: str, name: str, data: bytes, public: bool = False
) -> dict[str, Any]:
    """An object of `account` made as a job's output is: a write grant, a PUT, done."""
    job_id = uuid.uuid4().hex
    grant = await ask(
        nc,
        GrantPlatformObject.SUBJECT,
        {
            "account": account,
            "asset": asset,
            "name": name,
            "mode": "write",
            "job_id": job_id,
            "public": public,
        },
    )
    assert grant["method"] == "PUT", grant
    async with httpx.AsyncClient() as http:
        put = await http.put(grant["url"], content=data)
        assert put.status_code == 200, put.text
    done = await ask(
        nc,
        CompletePlatformObject.SUBJECT,
        {"account": account, "asset": asset, "name": grant["name"], "job_id": job_id},
    )
    assert done["state"] == "ready", done
    return done


async def test_an_accounts_objects_are_its_own(
    datastore: None, nats_server: NatsServer, scheduler_nc: Client
) -> None:
    alice, bob = f"alice{uuid.uuid4().hex[:6]}", f"bob{uuid.uuid4().hex[:6]}"
    first = await made(scheduler_nc, alice, "model", "train", b"weights")
    again = await made(scheduler_nc, alice, "model", "train", b"weights 2")
    assert (first["name"], again["name"]) == ("train", "train-2")  # named after the job
    assert first["size"] == 7 and len(first["sha256"]) == 64
    async with as_user(nats_server, alice) as a, as_user(nats_server, bob) as b:
        listed = await a.call(ListPlatformObjects.SUBJECT, b'{"asset": "model"}')
        assert sorted(o["name"] for o in listed["objects"]) == ["train", "train-2"]
        assert "key" not in listed["objects"][0]
        assert (await b.call(ListPlatformObjects.SUBJECT, b'{"asset": "model"}'))["objects"] == []
        shown = await a.call(GetPlatformObject.SUBJECT, b'{"asset": "model", "name": "train"}')
        assert shown["sha256"] == first["sha256"]
        # bob: not found, by its name or by alice's
        for name in ("train", f"{alice}/train"):
            body = json.dumps({"asset": "model", "name": name}).encode()
            got = await b.call(GetPlatformObject.SUBJECT, body)
            assert got["error"]["code"] == "not_found", got
        got = await b.call(RemovePlatformObject.SUBJECT, b'{"asset": "model", "name": "train"}')
        assert got["error"]["code"] == "not_found"
        # a grant for bob's job of alice's object: not found
        got = await ask(
            scheduler_nc,
            GrantPlatformObject.SUBJECT,
            {
                "account": bob,
                "asset": "model",
                "name": f"{alice}/train",
                "mode": "read",
                "job_id": "j",
            },
        )
        assert got["error"]["code"] == "not_found", got
        # alice's grant reads the bytes
        got = await ask(
            scheduler_nc,
            GrantPlatformObject.SUBJECT,
            {"account": alice, "asset": "model", "name": "train-2", "mode": "read", "job_id": "j"},
        )
        async with httpx.AsyncClient() as http:
            assert (await http.get(got["url"])).content == b"weights 2"
        # removed: gone from the list and from the store
        removed = await a.call(RemovePlatformObject.SUBJECT, b'{"asset": "model", "name": "train"}')
        assert removed["name"] == "train"
        listed = await a.call(ListPlatformObjects.SUBJECT, b'{"asset": "model"}')
        assert [o["name"] for o in listed["objects"]] == ["train-2"]


async def test_a_public_object_is_readable_never_removable_by_others(
    datastore: None, nats_server: NatsServer, scheduler_nc: Client
) -> None:
    alice, bob = f"alice{uuid.uuid4().hex[:6]}", f"bob{uuid.uuid4().hex[:6]}"
    await made(scheduler_nc, alice, "dataset", "coco", b"images", public=True)
    async with as_user(nats_server, bob) as b:
        body = json.dumps({"asset": "dataset", "name": f"{alice}/coco"}).encode()
        shown = await b.call(GetPlatformObject.SUBJECT, body)
        assert (shown["account"], shown["public"]) == (alice, True)
        listed = await b.call(ListPlatformObjects.SUBJECT, b'{"asset": "dataset", "public": true}')
        assert (alice, "coco") in [(o["account"], o["name"]) for o in listed["objects"]]
        for name in ("coco", f"{alice}/coco"):
            body = json.dumps({"asset": "dataset", "name": name}).encode()
            got = await b.call(RemovePlatformObject.SUBJECT, body)
            assert got["error"]["code"] in ("not_found", "invalid"), got
        got = await ask(
            scheduler_nc,
            GrantPlatformObject.SUBJECT,
            {
                "account": bob,
                "asset": "dataset",
                "name": f"{alice}/coco",
                "mode": "read",
                "job_id": "j",
            },
        )
        async with httpx.AsyncClient() as http:
            assert (await http.get(got["url"])).content == b"images"
    async with as_user(nats_server, alice) as a:
        shown = await a.call(GetPlatformObject.SUBJECT, b'{"asset": "dataset", "name": "coco"}')
        assert shown["state"] == "ready"


@pytest.mark.parametrize("who", ["user", "node", "service:billing"])
async def test_only_the_scheduler_may_ask_for_a_grant(
    datastore: None, nats_server: NatsServer, who: str
) -> None:
    kind, _, name = who.partition(":")
    creds = (
        nats_server.creds("user", "dev", account="alice")
        if kind == "user"
        else nats_server.creds(kind, name or "m1")
    )
    errors: list[Exception] = []

    async def on_error(exc: Exception) -> None:
        errors.append(exc)

    nc = await connect(nats_server, creds, error_cb=on_error)
    try:
        body = {"account": "alice", "asset": "model", "name": "n", "mode": "write", "job_id": "j"}
        with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
            await nc.request(GrantPlatformObject.SUBJECT, json.dumps(body).encode(), timeout=1.0)
    finally:
        await nc.close()
    assert any("permissions violation" in str(e).lower() for e in errors), errors


def test_the_secret_is_never_in_the_settings_repr(s3_server: S3Server, tmp_path: Path) -> None:
    shown = repr(settings(s3_server))
    assert s3_server.endpoint.secret_access_key not in shown
