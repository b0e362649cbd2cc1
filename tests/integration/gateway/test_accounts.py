"""The console gateway over the real bus: each person's request goes on their own short-lived
credential, redeemed by the gateway's identity from the provisioner. An operator adds and
removes an account; an account's user may do neither (403), and the provisioner's refusals
come back as their HTTP statuses. Signing out revokes the person's credential on the server."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import nats
import pytest
from gpufleet_client import Client
from gpufleet_contracts import subjects
from gpufleet_contracts.console import AdminOpenConsoleSession
from gpufleet_devstack import EmbeddedMongo, NatsServer
from gpufleet_gateway.app import build_app, bus_sessions
from gpufleet_gateway.sessions import Sessions
from gpufleet_gateway.settings import GatewaySettings

from ..provisioner.test_nodes import Bus, provisioner


async def _code(bus: Bus, operator: bool) -> str:
    if operator:
        reply = await bus.nc.request(AdminOpenConsoleSession.SUBJECT, b"{}", timeout=10)
    else:
        subject = subjects.as_account(
            subjects.rpc("provisioner", "open_console_session"), bus.account
        )
        reply = await bus.user.request(subject, b"{}", timeout=10)
    code: str = json.loads(reply.data)["code"]
    return code


@asynccontextmanager
async def console(server: NatsServer) -> AsyncIterator[tuple[httpx.AsyncClient, Sessions]]:
    settings = GatewaySettings(nats_url=server.url, nats_creds=server.creds("gateway"))
    gateway = await Client.connect(settings.nats_creds, settings.servers, name="gateway")
    sessions = bus_sessions(settings, gateway)
    app = build_app(settings, sessions)
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://console") as http:
            yield http, sessions
    finally:
        await sessions.close()
        await gateway.close()


async def _signed_in(http: httpx.AsyncClient, code: str) -> None:
    assert (await http.get("/login", params={"code": code})).status_code == 303


async def test_an_operator_removes_an_account_and_an_accounts_user_cannot(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    async with provisioner(nats_server, mongo_server, db_prefix) as bus:
        other = f"acct-{uuid.uuid4().hex[:6]}"
        async with console(nats_server) as (person, _):
            await _signed_in(person, await _code(bus, operator=False))
            assert (await person.post("/api/accounts", json={"account": other})).status_code == 403
            assert (await person.delete(f"/api/accounts/{bus.account}")).status_code == 403
            assert (await person.delete(f"/api/accounts/{other}")).status_code == 403
        async with console(nats_server) as (op, _):
            await _signed_in(op, await _code(bus, operator=True))
            assert (await op.post("/api/accounts", json={"account": other})).status_code == 200
            assert other in (await op.get("/api/accounts")).json()
            # an account holding a node: 409, the provisioner's refusal naming the field
            assert (await op.post("/api/accounts", json={"account": bus.account})).is_success
            await bus.region("lab")
            await bus.ask("add_node", {"region": "lab", "name": "box", "minion_id": "gw-m1"})
            held = await op.delete(f"/api/accounts/{bus.account}")
            assert held.status_code == 409
            assert held.json()["error"]["fields"][0]["field"] == "account"

            removed = await op.delete(f"/api/accounts/{other}")
            assert removed.status_code == 200, removed.text
            assert removed.json()["account"] == other
            assert other not in (await op.get("/api/accounts")).json()
            assert (await op.delete(f"/api/accounts/{other}")).status_code == 404
            assert (await op.delete("/api/accounts/platform")).status_code == 422


async def test_signing_out_revokes_the_persons_console_credential(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str
) -> None:
    async with provisioner(nats_server, mongo_server, db_prefix) as bus:
        async with console(nats_server) as (http, sessions):
            await _signed_in(http, await _code(bus, operator=False))
            [person] = sessions.people.values()
            creds = person.creds
            good = await nats.connect(nats_server.url, **creds.connect_options())
            await good.close()  # good until the sign-out
            assert (await http.post("/logout")).status_code == 200
            assert (await http.get("/api/me")).status_code == 401
        with pytest.raises(nats.errors.Error):
            await nats.connect(nats_server.url, allow_reconnect=False, **creds.connect_options())
