"""Composition root of the node agent: its ports (a broker, no store) in, its Service out;
every subject it handles is in the one wiring table below."""

from __future__ import annotations

from gpufleet_bus import Events, Every, Ports, Service, ServiceRuntime
from gpufleet_bus.streams import node_consumer_config
from gpufleet_contracts import subjects
from gpufleet_contracts.jobs import (
    StartWorker,
    StopWorker,
    WorkerFinished,
    WorkerStaging,
    WorkerStarted,
    WorkerUploading,
)
from gpufleet_contracts.nodes import NodeHeartbeat, RegisterNode
from gpufleet_contracts.serving import EndpointMetered, EndpointReady
from gpufleet_contracts.verification import GpuCheckReported, VerifyGpus
from gpufleet_telemetry.exposition import Source

from . import sealing
from .agent import Agent
from .settings import AgentSettings

SERVICE = "node-agent"


def dead_letter_service(minion_id: str) -> str:
    """The service token of this node's dead letters, `gpufleet.v1.dlq.node-<minion_id>.*`:
    the only dead-letter subjects its credential may publish (gpufleet_auth.permissions).
    Give it to make_broker (`dead_letters_as`)."""
    return f"node-{minion_id}"


def build_app(ports: Ports, settings: AgentSettings | None = None) -> Service[Agent]:
    settings = settings or AgentSettings()
    agent = Agent(
        settings,
        ports.broker,
        ports.clock,
        # the key its workers' secrets are sealed to, made at the first start that finds
        # none and vouched for by the node's credential (sealing.py)
        sealing_key=sealing.NodeKey(settings.agent_state_dir, ports.bus.nats_creds),
        control_plane=ports.bus.servers,
    )
    mid = settings.minion_id
    # No streams to declare and no shared health subject: its credential allows neither.
    rt = ServiceRuntime(SERVICE, ports, infrastructure=False)
    rt.wire(
        # Requests to this node alone (its health), from services and operators.
        direct={subjects.node_health(mid): agent.health},
        events={
            # One consumer for the node's commands, in order; the provisioner created it at
            # enrolment and this node may only read it. A command of another type, or
            # without its CloudEvents headers, is dead-lettered.
            "commands": Events(
                {
                    StartWorker: agent.on_start_worker,
                    StopWorker: agent.on_stop_worker,
                    VerifyGpus: agent.checks.on_verify_gpus,  # verified nodes (gpuchecks.py)
                },
                subject=subjects.command("node", "*", key=mid),
                consumer=node_consumer_config(mid),
            ),
        },
        publishes=[
            RegisterNode,
            WorkerStarted,
            WorkerUploading,
            WorkerStaging,
            WorkerFinished,
            NodeHeartbeat,
            GpuCheckReported,
            EndpointReady,  # its endpoints' proxy (proxy/served.py)
            EndpointMetered,
        ],
        # Its GPUs (attributed to the jobs holding them) and host (host/metrics.py).
        metrics=[Source("node", agent.metrics.collect)],
        # The datastores it mounted, probed and healed (mounts/keeper.py).
        every=[
            Every(
                settings.datastore_probe_s,
                agent.datastores.heal,
                "datastore-probes",
                at_start=False,
            )
        ],
        # Before the broker consumes: the GPUs and the workers a previous run left.
        prepare=[agent.prepare],
        startup=[agent.start],
        shutdown=[agent.stop],
    )
    return rt.built(agent)
