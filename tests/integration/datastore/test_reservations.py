"""Port reservations on the real servers (R-RES-3): a `team` plan and a region with a compute
node (R-RES-1), hostname + port unique in a region of an owner (and free for another
owner's same-named region), a node of the region reading one to publish and no other node,
another account's "not found"."""

from __future__ import annotations

import json
import uuid
from typing import Any

from gpufleet_contracts import subjects
from gpufleet_contracts.reservations import (
    AddReservation,
    GetReservation,
    ListReservations,
    RemoveReservation,
)
from gpufleet_devstack import NatsServer

from ..conftest import as_user, connect
from ..provisioner.test_nodes import Bus
from .test_regional_datastores import admin, services  # noqa: F401  (fixture)

WEB: dict[str, Any] = {"region": "lab-1", "name": "web", "hostname": "demo", "port": 8080}


async def as_node(nats_server: NatsServer, minion: str, account: str, name: str) -> Any:
    nc = await connect(nats_server, nats_server.creds("node", minion, account=account))
    try:
        reply = await nc.request(
            subjects.as_node(GetReservation.SUBJECT, minion),
            json.dumps({"name": name}).encode(),
            timeout=10,
        )
    finally:
        await nc.close()
    return json.loads(reply.data)


async def test_reservations_are_unique_per_region_of_an_owner(
    services: Bus,  # noqa: F811
    nats_server: NatsServer,
) -> None:
    bus = services
    await bus.ask("enable_provider", {"provider": "physical"})
    await bus.ask("create_region", {"name": "lab-1"})
    node = f"m{uuid.uuid4().hex[:8]}"
    async with as_user(nats_server, bus.account, "u") as me:

        async def add(body: dict[str, Any]) -> dict[str, Any]:
            return await me.call(AddReservation.SUBJECT, json.dumps(body).encode())

        assert (await add(WEB))["error"]["fields"][0]["rule"] == "R-TEN-3"
        await admin(bus, "create_account", {"account": bus.account, "plan": "team"})
        assert (await add(WEB))["error"]["fields"][0]["rule"] == "R-RES-1"
        await bus.ask("add_node", {"region": "lab-1", "name": "box", "minion_id": node})

        added = await add(WEB)
        assert (added["hostname"], added["port"], added["type"]) == ("demo", 8080, "port")
        taken = await add({**WEB, "name": "other"})
        assert taken["error"]["code"] == "conflict", taken
        assert taken["error"]["fields"][0]["field"] == "hostname"
        again = await add({**WEB, "port": 8081})
        assert again["error"]["fields"][0]["field"] == "name", again
        assert (
            "hostname"
            in (await add({**WEB, "name": "x", "hostname": "Bad_Name"}))["error"]["fields"][0][
                "field"
            ]
        )
        assert "port" in json.dumps(await add({**WEB, "name": "y", "port": 70000}))
        assert (await add({**WEB, "name": "z", "port": 9000}))["port"] == 9000  # another port

        listed = await me.call(ListReservations.SUBJECT, b"{}")
        assert [(r["name"], r["port"]) for r in listed["reservations"]] == [
            ("web", 8080),
            ("z", 9000),
        ]

    # the node of the region may read it to publish; another account's node may not
    mine = await as_node(nats_server, node, bus.account, "web")
    assert (mine["hostname"], mine["port"]) == ("demo", 8080), mine
    theirs = await as_node(nats_server, "evil", "mallory", "web")
    assert theirs["error"]["code"] == "not_found", theirs

    # another account: not found; its own same-named region and hostname:port are its own
    async with as_user(nats_server, "mallory") as eve:
        body = b'{"region": "lab-1", "name": "web"}'
        assert (await eve.call(RemoveReservation.SUBJECT, body))["error"]["code"] == "not_found"
        assert (await eve.call(ListReservations.SUBJECT, b"{}"))["reservations"] == []

    async with as_user(nats_server, bus.account, "u") as me:
        gone = await me.call(RemoveReservation.SUBJECT, b'{"region": "lab-1", "name": "web"}')
        assert gone["name"] == "web"
        back = await me.call(AddReservation.SUBJECT, json.dumps({**WEB, "name": "w2"}).encode())
        assert back["hostname"] == "demo", back  # the pair is free again
