"""Removing an account over the real bus and database (R-TEN-1): refused while it holds a
node; then every credential of it (users, console sessions, enrolled machines) is cut off
at once, its join tokens voided, `AccountRemoved` published, and its name kept."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import nats
import pytest
from gpufleet_auth import Creds
from gpufleet_contracts import subjects
from gpufleet_contracts.console import RedeemConsoleCode
from gpufleet_contracts.identity import AccountRemoved, RemoveAccount
from gpufleet_devstack import EmbeddedMongo, NatsServer, wait_for_async
from nats.aio.client import Client

from .test_nodes import Bus, provisioner


async def _admin(bus: Bus, verb: str, body: dict[str, Any]) -> dict[str, Any]:
    reply = await bus.nc.request(
        subjects.admin("provisioner", verb), json.dumps(body).encode(), timeout=10
    )
    data: dict[str, Any] = json.loads(reply.data)
    return data


async def _connect(server: NatsServer, creds_text: str, path: Any) -> Client:
    written = Creds.parse(creds_text).write(path)
    return await nats.connect(server.url, allow_reconnect=False, **NatsServer.client(written))


async def test_an_account_is_removed_only_without_nodes_and_every_credential_goes_with_it(
    nats_server: NatsServer, mongo_server: EmbeddedMongo, db_prefix: str, tmp_path: Any
) -> None:
    async with provisioner(nats_server, mongo_server, db_prefix) as bus:
        account = bus.account
        removed_events: list[dict[str, Any]] = []

        async def on_removed(msg: Any) -> None:
            removed_events.append(json.loads(msg.data))

        await bus.nc.subscribe(AccountRemoved.SUBJECT, cb=on_removed)
        await _admin(bus, "create_account", {"account": account, "plan": "team"})
        al = await _connect(
            nats_server,
            (await _admin(bus, "add_user", {"account": account, "user": "al"}))["creds"],
            tmp_path / "al.creds",
        )
        # al's console session: opened on al's connection, redeemed (operators may)
        opened = await al.request(
            subjects.as_account(subjects.rpc("provisioner", "open_console_session"), account),
            b"{}",
            timeout=10,
        )
        code = json.loads(opened.data)["code"]
        session = await bus.nc.request(
            RedeemConsoleCode.SUBJECT, json.dumps({"code": code}).encode(), timeout=10
        )
        console = await _connect(
            nats_server, json.loads(session.data)["creds"], tmp_path / "console.creds"
        )
        # a machine enrolled for it (never added as a node) and a join token not spent
        machine = await bus.node(f"rm-{uuid.uuid4().hex[:6]}", "lab")
        assert (await bus.token(f"rt-{uuid.uuid4().hex[:6]}"))["token"]
        m = f"rn-{uuid.uuid4().hex[:6]}"
        added = await bus.ask("add_node", {"region": "lab", "name": "box", "minion_id": m})
        assert added["state"] == "provisioning", added

        refused = await _admin(bus, "remove_account", {"account": account})
        assert refused["error"]["code"] == "conflict", refused
        [field] = refused["error"]["fields"]
        assert (field["field"], field["rule"]) == ("account", "R-TEN-1")
        assert m in field["message"]
        await asyncio.sleep(0.3)
        assert al.is_connected and console.is_connected and machine.is_connected
        assert removed_events == []

        assert (await bus.ask("remove_node", {"node": m}))["state"] == "removed"
        reply = RemoveAccount.REPLY.model_validate(
            await _admin(bus, "remove_account", {"account": account})
        )
        assert (reply.account, reply.users) == (account, ["al"])
        assert (reply.console_sessions, reply.join_tokens) == (1, 1)
        for cut_off in (al, console, machine):
            await wait_for_async(lambda c=cut_off: c.is_closed, timeout=5)
        with pytest.raises(nats.errors.Error):
            await nats.connect(
                nats_server.url,
                allow_reconnect=False,
                **NatsServer.client(tmp_path / "al.creds"),
            )
        await wait_for_async(lambda: len(removed_events) == 1, timeout=5)
        assert removed_events[0]["account"] == account

        # idempotent as "not found"; the name is a tombstone, never another tenant's
        again = await _admin(bus, "remove_account", {"account": account})
        assert again["error"]["code"] == "not_found"
        taken = await _admin(bus, "create_account", {"account": account, "plan": "free"})
        assert taken["error"]["code"] == "conflict"
        assert taken["error"]["fields"][0]["rule"] == "R-TEN-1"
        listed = await _admin(bus, "list_accounts", {})
        assert account not in [a["account"] for a in listed["accounts"]]
        for verb, body in (
            ("set_plan", {"account": account, "plan": "free"}),
            ("add_user", {"account": account, "user": "bo"}),
            ("issue_join_token", {"account": account, "minion_id": "x-1", "region": "lab"}),
        ):
            assert (await _admin(bus, verb, body))["error"]["code"] == "not_found", verb
