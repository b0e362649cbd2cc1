"""Composition root of the provisioner; every subject it handles is wired here."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from faststream import FastStream
from faststream.nats import NatsBroker, NatsMessage
from gpufleet_bus import ServiceRuntime, account_of, env_flag
from gpufleet_contracts import subjects
from gpufleet_contracts.nodes import NodeHeartbeat, NodeRegistered, NodeStateChanged, RegisterNode
from gpufleet_store import Store, utcnow

from .service import INDEXES, Provisioner

SERVICE = "provisioner"


def build_app(
    store: Store,
    broker: NatsBroker,
    clock: Callable[[], datetime] = utcnow,
    auto_activate: bool | None = None,
) -> tuple[FastStream, Provisioner]:
    rt = ServiceRuntime(SERVICE, broker, store, indexes=INDEXES)
    if auto_activate is None:
        auto_activate = env_flag("GPUFLEET_AUTO_ACTIVATE_NODES", default=True)
    prov = Provisioner(store, clock, auto_activate)
    rt.publishes(NodeRegistered, NodeStateChanged)

    @rt.on_event(RegisterNode, "register-node")
    async def on_register_node(body: RegisterNode, msg: NatsMessage) -> None:
        await prov.register(body, (msg.headers or {}).get("ce-id"))

    @broker.subscriber(
        f"{subjects.HEARTBEATS}.*", queue=f"{SERVICE}-heartbeats", title="provisioner:heartbeat"
    )
    async def on_heartbeat(body: NodeHeartbeat) -> None:
        await prov.heartbeat(body)

    @rt.on_request("list_nodes", description="The acting account's nodes.")
    async def list_nodes(msg: NatsMessage) -> dict[str, Any]:
        return {"nodes": await prov.list_nodes(account_of(msg.headers))}

    return rt.app, prov
