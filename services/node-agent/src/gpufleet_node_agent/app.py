"""Composition root of the node agent: settings and broker in, FastStream app out."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from faststream import FastStream
from faststream.middlewares import AckPolicy
from faststream.nats import NatsBroker, NatsMessage
from gpufleet_bus import BusSettings, ServiceRuntime, UnknownMessageType
from gpufleet_bus.streams import node_consumer, node_consumer_config
from gpufleet_contracts import subjects
from gpufleet_contracts.jobs import StartWorker, StopWorker, WorkerFinished, WorkerStarted
from gpufleet_contracts.nodes import NodeHeartbeat, RegisterNode

from .agent import Agent
from .files import utcnow
from .settings import AgentSettings

SERVICE = "node-agent"


def dead_letter_service(minion_id: str) -> str:
    """The service token of this node's dead letters, `gpufleet.v1.dlq.node-<minion_id>.*`:
    the only dead-letter subjects its credential may publish (gpufleet_auth.permissions).
    Give it to make_broker (`dead_letters_as`)."""
    return f"node-{minion_id}"


def health_subject(minion_id: str) -> str:
    """`gpufleet.v1.node.<minion_id>.health`: one agent's own health."""
    return subjects.node(minion_id, "health")


COMMANDS: dict[str, type[StartWorker] | type[StopWorker]] = {
    StartWorker.TYPE: StartWorker,
    StopWorker.TYPE: StopWorker,
}


def decode_command(ce_type: str, data: bytes) -> StartWorker | StopWorker:
    """A node command by its CloudEvents type; an unknown type is refused like a bad body."""
    model = COMMANDS.get(ce_type)
    if model is None:
        raise UnknownMessageType(ce_type, sorted(COMMANDS))
    return model.from_bytes(data)


def build_app(
    settings: AgentSettings,
    broker: NatsBroker,
    clock: Callable[[], datetime] = utcnow,
    *,
    bus: BusSettings | None = None,
) -> tuple[FastStream, Agent]:
    rt = ServiceRuntime(SERVICE, broker, None, bus=bus, infrastructure=False)
    agent = Agent(settings, broker, clock)
    mid = settings.minion_id
    rt.publishes(RegisterNode, WorkerStarted, WorkerFinished, NodeHeartbeat)

    # One consumer for the node's commands, in order; the provisioner created it at
    # enrolment and this node may only read it (gpufleet_bus.streams.node_consumer_config).
    # A command of another type, or without its CloudEvents headers, is dead-lettered.
    @rt.on_event(
        StartWorker,
        node_consumer(mid),
        subject=f"{subjects.COMMANDS}.node.{mid}.*",
        consumer=node_consumer_config(mid),
        types=(StartWorker, StopWorker),
    )
    async def on_command(body: dict[str, Any], msg: NatsMessage) -> None:
        cmd = decode_command(str((msg.headers or {}).get("ce-type", "")), msg.body)
        if isinstance(cmd, StartWorker):
            await agent.on_start_worker(cmd)
        else:
            await agent.on_stop_worker(cmd)

    # Requests to this node alone (its health), from services and operators.
    @broker.subscriber(
        health_subject(mid), ack_policy=AckPolicy.MANUAL, title=f"{SERVICE}:{mid}:health"
    )
    async def node_health() -> dict[str, Any]:
        return await agent.health()

    rt.app.on_startup(agent.prepare)  # after the runtime declared the streams
    rt.app.after_startup(agent.start)
    rt.app.on_shutdown(agent.stop)
    return rt.app, agent
