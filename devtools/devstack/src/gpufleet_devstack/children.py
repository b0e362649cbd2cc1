"""The child processes `just up` (and the e2e tests) start, and each one's environment."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final


@dataclass(frozen=True)
class ServiceSpec:
    """One child process of `just up`."""

    name: str  # log file name, and `health` subject part unless `health` says otherwise
    module: str  # run as `python -m <module>`
    health: str | None  # answers subjects.rpc(<health>, "health"); None: no health RPC
    env: Mapping[str, str] = field(default_factory=dict)  # extra env; {run_dir} is expanded
    defaults: Mapping[str, str] = field(default_factory=dict)  # extra env, unless already set
    stop_timeout: float = 10.0  # seconds from SIGTERM to SIGKILL


NODE_NAME: Final = "local-node-1"
# Every child writes the spans of the sampled jobs here, as JSON lines (gpufleet_telemetry
# .spanfile); `just trace <job>` shows one job's trace.
TRACES: Final = {"GPUFLEET_TRACE_DIR": "{run_dir}/traces"}

# Started in this order, stopped in the reverse order.
SERVICES: Final[tuple[ServiceSpec, ...]] = (
    # Development: a node is active at once (production leaves it in maintenance, R-NODE-2).
    ServiceSpec(
        "provisioner",
        "gpufleet_provisioner",
        health="provisioner",
        defaults={**TRACES, "GPUFLEET_AUTO_ACTIVATE_NODES": "true"},
    ),
    ServiceSpec("scheduler", "gpufleet_scheduler", health="scheduler", defaults=TRACES),
    ServiceSpec("billing", "gpufleet_billing", health="billing", defaults=TRACES),
    ServiceSpec("device-fleet", "gpufleet_device_fleet", health="device-fleet", defaults=TRACES),
    ServiceSpec("datastore", "gpufleet_datastore", health="datastore", defaults=TRACES),
    ServiceSpec(
        "node-agent",
        "gpufleet_node_agent",
        health=None,
        env={
            "GPUFLEET_MINION_ID": NODE_NAME,
            "GPUFLEET_NODE_NAME": NODE_NAME,
            "GPUFLEET_REGION": "local",
            "GPUFLEET_AGENT_STATE_DIR": "{run_dir}/agent",
        },
        # R-NODE-6: simulated GPUs only on request. `just up` asks for them (the same node on
        # every laptop); GPUFLEET_SIMULATED_GPUS=0 just up reads the real GPUs through NVML.
        # Its 16 (simulated) CPUs: 8 offered to CPU-only jobs (R-JOB-2), 8 for GPU work.
        # The local node goes with the stack: Ctrl-C stops its workers too.
        defaults={
            **TRACES,
            "GPUFLEET_SIMULATED_GPUS": "1",
            "GPUFLEET_CPU_JOB_CPUS": "8",
            "GPUFLEET_STOP_WORKERS_ON_EXIT": "1",
        },
        stop_timeout=30.0,  # its workers' grace period (10 s), then their reports
    ),
)

# An edge device's agent (the node agent in device mode), started by whoever runs one: it
# enrols with its device's join token (GPUFLEET_JOIN_TOKEN, GPUFLEET_MINION_ID and
# GPUFLEET_DEVICE_STATE_DIR given), simulated unless told otherwise.
DEVICE_AGENT: Final = ServiceSpec(
    "device-agent",
    "gpufleet_node_agent.device",
    health=None,
    defaults={"GPUFLEET_DEVICE_RUNTIME": "simulated"},
)

# The web console's gateway: started after the services, on its own narrow identity (it may
# only redeem sign-in codes; each person's requests go on that person's credential).
CONSOLE_PORT: Final = 8470
CONSOLE: Final = ServiceSpec(
    "gateway",
    "gpufleet_gateway",
    health=None,
    defaults={"GPUFLEET_CONSOLE_PORT": str(CONSOLE_PORT)},
)


def child_env(
    spec: ServiceSpec, base: Mapping[str, str], stack: Mapping[str, str], run_dir: Path
) -> dict[str, str]:
    """A child's environment: `base` (ours), the spec's defaults where `base` has none, the
    stack's endpoints, then the spec's own settings."""
    env = dict(base)
    env.setdefault("PYTHONUNBUFFERED", "1")
    for key, value in spec.defaults.items():
        env.setdefault(key, value.format(run_dir=run_dir))
    env.update(stack)
    for key, value in spec.env.items():
        env[key] = value.format(run_dir=run_dir)
    return env
