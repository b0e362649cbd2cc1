"""Composition root of the node agent: settings and broker in, FastStream app out."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from faststream import FastStream
from faststream.middlewares import AckPolicy
from faststream.nats import NatsBroker
from gpufleet_bus import BusSettings, ServiceRuntime
from gpufleet_contracts import subjects
from gpufleet_contracts.jobs import StartWorker, StopWorker, WorkerFinished, WorkerStarted
from gpufleet_contracts.nodes import NodeHeartbeat, RegisterNode

from .agent import Agent
from .files import utcnow
from .settings import AgentSettings

SERVICE = "node-agent"


def health_subject(minion_id: str) -> str:
    """`gpufleet.v1.rpc.node.<minion_id>.health`: one agent's own health, not a queue group."""
    return subjects.rpc(f"node.{minion_id}", "health")


def build_app(
    settings: AgentSettings,
    broker: NatsBroker,
    clock: Callable[[], datetime] = utcnow,
    *,
    bus: BusSettings | None = None,
) -> tuple[FastStream, Agent]:
    rt = ServiceRuntime(SERVICE, broker, None, bus=bus)
    agent = Agent(settings, broker, clock)
    mid = settings.minion_id
    rt.publishes(RegisterNode, WorkerStarted, WorkerFinished, NodeHeartbeat)

    @rt.on_event(
        StartWorker, f"node-{mid}-start", subject=StartWorker.SUBJECT.format(minion_id=mid)
    )
    async def on_start_worker(body: StartWorker) -> None:
        await agent.on_start_worker(body)

    @rt.on_event(StopWorker, f"node-{mid}-stop", subject=StopWorker.SUBJECT.format(minion_id=mid))
    async def on_stop_worker(body: StopWorker) -> None:
        await agent.on_stop_worker(body)

    # ServiceRuntime's `gpufleet.v1.rpc.node-agent.health` is answered by any one agent
    # (a queue group); this subject asks one node by its minion id.
    @broker.subscriber(
        health_subject(mid), ack_policy=AckPolicy.MANUAL, title=f"{SERVICE}:{mid}:health"
    )
    async def node_health() -> dict[str, Any]:
        return await agent.health()

    rt.app.on_startup(agent.prepare)  # after the runtime declared the streams
    rt.app.after_startup(agent.start)
    rt.app.on_shutdown(agent.stop)
    return rt.app, agent
