"""Helpers for integration tests: run service apps in-process against the real servers.

Authentication is on (gpufleet_devstack.NatsServer): every connection carries a credential
and the server enforces its permissions (gpufleet_auth.permissions). A service's broker
connects with that service's own credential, so a test also checks that the permission
table allows what the service really does. A test that plays someone else connects as
them: `as_user` for an account's requests, `as_identity` for a service or a node agent
publishing its events, `admin_connect` for the test harness itself (reading streams,
deleting consumers: an operator).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import nats
from faststream import FastStream
from faststream.nats import NatsBroker
from gpufleet_auth import permissions
from gpufleet_bus import BusSettings, make_broker
from gpufleet_contracts import subjects
from gpufleet_devstack import NatsServer
from gpufleet_store import Store, StoreSettings
from nats.aio.client import Client


def store_for(service: str, mongo_url: str, prefix: str) -> Store:
    return Store.connect(service, StoreSettings(mongo_url=mongo_url, db_prefix=prefix))


def service_creds(service: str, server: NatsServer) -> Path:
    """The service's own credential; a service only tests define (`svc`) has no row in the
    permission table and connects as an operator."""
    if service in permissions.SERVICES:
        return server.creds("service", service)
    return server.creds("operator")


def broker_for(service: str, server: NatsServer) -> NatsBroker:
    return make_broker(
        service, BusSettings(nats_url=server.url, nats_creds=service_creds(service, server))
    )


async def connect(server: NatsServer, creds: Path | None = None, **kw: Any) -> Client:
    """A nats-py connection with `creds` (none: an operator's)."""
    options = NatsServer.client(creds) if creds is not None else server.admin()
    return await nats.connect(server.url, **options, **kw)


async def admin_connect(server: NatsServer, **kw: Any) -> Client:
    """The test harness: an operator, who may read and change everything."""
    return await connect(server, **kw)


class JsPublisher:
    """A nats-py connection as gpufleet_bus.publish's Publisher: JetStream (its ack awaited)
    where a stream holds the subject, core NATS otherwise."""

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.js = nc.jetstream()

    async def publish(
        self,
        message: bytes,
        subject: str,
        *,
        headers: dict[str, str] | None = None,
        stream: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the broker's signature
    ) -> object:
        if stream is None:
            await self.nc.publish(subject, message, headers=headers)
            return None
        return await self.js.publish(
            subject, message, timeout=timeout or 5.0, stream=stream, headers=headers
        )


@asynccontextmanager
async def as_identity(
    server: NatsServer, kind: str, name: str = "", account: str = "local"
) -> AsyncIterator[JsPublisher]:
    """Connected as a service (`kind="service"`), a node agent (`"node"`, name = minion id)
    or a user, for publishing what that identity publishes."""
    nc = await connect(server, server.creds(kind, name, account=account))
    try:
        yield JsPublisher(nc)
    finally:
        await nc.close()


class AccountClient:
    """A user of `account`: requests go to `<subject>.<account>`, with that user's
    credential (the only subjects the server lets it publish)."""

    def __init__(self, nc: Client, account: str) -> None:
        self.nc = nc
        self.account = account

    async def request(self, base: str, payload: bytes, timeout: float = 10.0) -> Any:  # noqa: ASYNC109
        return await self.nc.request(
            subjects.as_account(base, self.account), payload, timeout=timeout
        )

    async def call(self, base: str, payload: bytes, timeout: float = 10.0) -> dict[str, Any]:  # noqa: ASYNC109
        reply = await self.request(base, payload, timeout)
        data: dict[str, Any] = json.loads(reply.data)
        return data


@asynccontextmanager
async def as_user(
    server: NatsServer, account: str = "local", user: str = "dev"
) -> AsyncIterator[AccountClient]:
    nc = await connect(server, server.creds("user", user, account=account))
    try:
        yield AccountClient(nc, account)
    finally:
        await nc.close()


@asynccontextmanager
async def running(*apps: FastStream) -> AsyncIterator[None]:
    """Start apps (startup hooks, broker, after-startup hooks) and stop them at the end."""
    started: list[FastStream] = []
    try:
        for app in apps:
            await app.start()
            started.append(app)
        yield
    finally:
        for app in reversed(started):
            await app.stop()
